"""The parity gate: the exported bundle must caption as the PyTorch model does.

On a fixed set of inputs (the checkpoint's own validation images or features when its meta or
--data names them, otherwise seeded random inputs) both sides run end to end, each on its own
intermediate results:
- per graph, max |onnxruntime - PyTorch| on its outputs (features, cross tensors, and the step's
  log-probs along PyTorch's greedy path: the bundle's step is fed the tokens PyTorch was fed);
- greedy and beam captions (`edgecap.models.decoding.generate` vs `Bundle.decode`) compared
  token by token;
- the CIDEr-D of both sides' beam captions against the data's references, or against the
  PyTorch captions when there are none.
fp32 must match exactly (every caption token-identical, graph deltas within the spec's
tolerances) or the export fails; fp16 / int8 report how close they came.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from edgecap.errors import EdgecapError
from edgecap.export.specs.base import ExportSpec
from edgecap.models.decoding import CachedStepper, generate
from edgecap.contract.beam import DecodeOptions, beam_search
from edgecap.runtime.session import Bundle

DATA_META_KEYS = ("data_dir", "data", "dataset")


@dataclass
class ParityInputs:
    batches: list[tuple[torch.Tensor, ...]]  # model inputs, each exactly the static batch
    count: int  # real samples (the last batch may be padded with copies)
    source: str
    refs: list[list[str]] | None = None
    ids: list = field(default_factory=list)


# -- inputs ------------------------------------------------------------------------------------
def _batches(inputs: tuple[torch.Tensor, ...], batch: int) -> list[tuple[torch.Tensor, ...]]:
    n = inputs[0].shape[0]
    out = []
    for start in range(0, n, batch):
        chunk = [x[start:start + batch] for x in inputs]
        short = batch - chunk[0].shape[0]
        if short:
            chunk = [torch.cat([c, c[-1:].expand(short, *c.shape[1:])]) for c in chunk]
        out.append(tuple(c.contiguous() for c in chunk))
    return out


def _dataset_items(data_dir: Path, n: int) -> list[dict]:
    path = data_dir / "dataset_coco.json"
    if not path.is_file():
        raise EdgecapError(f"parity data {data_dir}: no dataset_coco.json")
    images = json.loads(path.read_text(encoding="utf-8")).get("images", [])
    for split in ("val", "test", "restval", "train"):
        chosen = [im for im in images if im.get("split") == split]
        if chosen:
            return chosen[:n]
    raise EdgecapError(f"parity data {path}: no images")


def _refs(items: list[dict]) -> list[list[str]]:
    return [[" ".join(s.get("tokens") or s.get("raw", "").lower().split()) for s in im.get("sentences", [])]
            for im in items]


def load_parity_inputs(spec: ExportSpec, n: int, data: str = "", meta: dict | None = None,
                       seed: int = 0) -> ParityInputs:
    meta = meta or {}
    data_dir = data or next((str(meta[k]) for k in DATA_META_KEYS if meta.get(k)), "")
    if data_dir and Path(data_dir).is_dir():
        items = _dataset_items(Path(data_dir), n)
        if spec.takes_images:
            import cv2

            from edgecap.contract.preprocess import preprocess

            pre = spec.preprocessing()
            arrays = []
            for im in items:
                path = Path(data_dir) / "images" / im.get("filepath", "") / im["filename"]
                bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
                if bgr is None:
                    raise EdgecapError(f"parity data: cannot read image {path}")
                arrays.append(preprocess(bgr, pre["size"], pre["mean"], pre["std"], pre["resize"], pre["channel_order"]))
            inputs = (torch.from_numpy(np.stack(arrays)), *spec.extra_inputs(len(items)))
        else:
            from edgecap.data.features import FeatureStore

            h5 = meta.get("features") or str(Path(data_dir) / "features.h5")
            with FeatureStore(h5, n_regions=spec.cfg.n_regions) as store:
                feats, mask = store.get_batch([im.get("cocoid", im.get("id")) for im in items])
            inputs = (torch.from_numpy(feats), torch.from_numpy(mask), *spec.extra_inputs(len(items)))
        refs = _refs(items)
        return ParityInputs(_batches(inputs, spec.batch), len(items), f"validation data {data_dir} ({len(items)} images)",
                            refs if all(refs) else None, [im.get("cocoid", im.get("id")) for im in items])
    source = f"random inputs (seed {seed})"
    if data_dir:
        source += f"; the data dir {data_dir} named by the checkpoint does not exist here"
    return ParityInputs(_batches(spec.random_inputs(n, seed), spec.batch), n, source)


# -- comparisons ------------------------------------------------------------------------------
def _max_delta(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == bool or b.dtype == bool:
        return float(np.any(a != b))
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def _sequences(tokens: np.ndarray, lengths: np.ndarray) -> list[tuple[int, ...]]:
    best, lens = np.asarray(tokens)[:, 0], np.asarray(lengths)[:, 0]
    return [tuple(int(t) for t in row[: int(n)]) for row, n in zip(best, lens, strict=False)]


class _Recorder:
    """A Stepper that remembers the tokens it was fed and the log-probs it returned."""

    def __init__(self, stepper):
        self.stepper, self.tokens, self.logprobs = stepper, [], []

    def __call__(self, tokens: np.ndarray, t: int) -> np.ndarray:
        out = self.stepper(tokens, t)
        self.tokens.append(np.array(tokens, copy=True))
        self.logprobs.append(np.array(out, copy=True))
        return out

    def reorder(self, rows: np.ndarray) -> None:
        self.stepper.reorder(rows)


def _replay_delta(recorded: _Recorder, stepper) -> float:
    """Feed the bundle's stepper PyTorch's greedy tokens; max |delta log-prob| over the path."""
    delta = 0.0
    for t, (tokens, logprobs) in enumerate(zip(recorded.tokens, recorded.logprobs, strict=True)):
        delta = max(delta, _max_delta(logprobs, stepper(np.ascontiguousarray(tokens), t)))
    return delta


@torch.no_grad()
def parity_gate(spec: ExportSpec, bundle: Bundle, inputs: ParityInputs, precision: str, vocab) -> dict:
    model, cfg = spec.model, spec.cfg
    k = bundle.beam_size
    deltas = {"visual": 0.0, "encoder": 0.0, "decoder_step": 0.0}
    seqs = {"greedy": ([], []), "beam": ([], [])}
    for batch in inputs.batches:
        feats_t, mask_t = spec.features(batch)
        front, extra = spec.split(batch)
        if bundle.has_visual:
            feats_b, mask_b = bundle.visual(front[0].numpy())
            deltas["visual"] = max(deltas["visual"], _max_delta(feats_t, feats_b), _max_delta(mask_t, mask_b))
        else:
            feats_b, mask_b = front[0].numpy(), front[1].numpy()
        cross_t = model.encode(feats_t, mask_t, *extra)
        cross_b = bundle.encode(feats_b, mask_b, *(x.numpy() for x in extra))
        for a, b in zip(cross_t, cross_b, strict=False):
            deltas["encoder"] = max(deltas["encoder"], _max_delta(a, b))
        for name, beam in (("greedy", 1), ("beam", k)):
            options = DecodeOptions(beam_size=beam, max_len=bundle.max_len)
            if name == "greedy":  # what `generate` does, recording PyTorch's log-probs on the way
                recorded = _Recorder(CachedStepper(model, cross_t, spec.batch, 1))
                hyp_t = beam_search(recorded, spec.batch, options, cfg.bos_id, cfg.eos_id, cfg.pad_id)
                step_delta = _replay_delta(recorded, bundle.stepper(cross_b, repeats=1))
                deltas["decoder_step"] = max(deltas["decoder_step"], step_delta)
            else:
                hyp_t = generate(model, feats_t, mask_t, options, **({"extra": extra} if extra else {}))
            hyp_b = bundle.decode(cross_b, options)
            seqs[name][0].extend(_sequences(hyp_t.tokens, hyp_t.lengths))
            seqs[name][1].extend(_sequences(hyp_b.tokens, hyp_b.lengths))
    n = inputs.count
    report: dict = {
        "precision": precision,
        "inputs": inputs.source,
        "samples": n,
        "max_abs_delta": {role: deltas[role] for role in ("visual", "encoder", "decoder_step")
                          if role != "visual" or bundle.has_visual},
        "tolerance": spec.tolerances(),
    }
    for name, (ts, bs) in seqs.items():
        same = [a == b for a, b in zip(ts[:n], bs[:n], strict=False)]
        report[f"{name}_identical"] = float(np.mean(same)) if same else 1.0
    report["beam_size"] = k
    report.update(_cider(seqs["beam"][0][:n], seqs["beam"][1][:n], inputs.refs, vocab, bundle))
    report["passed"] = _passed(report, precision)
    return report


def _cider(torch_seqs, bundle_seqs, refs, vocab, bundle) -> dict:
    from edgecap.metrics.ciderd import CiderD

    def text(seq):
        return " ".join(vocab.decode(list(seq))) or "<empty>"

    cands_t = [text(s) for s in torch_seqs]
    cands_b = [text(s) for s in bundle_seqs]
    source = "dataset"
    if refs is None:
        refs, source = [[c] for c in cands_t], "pytorch captions"
    scorer = CiderD(refs)
    cider_t, _ = scorer.score(cands_t, refs)
    cider_b, _ = scorer.score(cands_b, refs)
    return {"cider_references": source, "cider_pytorch": float(cider_t), "cider_bundle": float(cider_b),
            "cider_delta": float(cider_b - cider_t)}


def _passed(report: dict, precision: str) -> bool:
    if precision != "fp32":
        return True  # reduced precision is reported, not gated
    within = all(report["max_abs_delta"][r] <= report["tolerance"][r] for r in report["max_abs_delta"])
    return within and report["greedy_identical"] == 1.0 and report["beam_identical"] == 1.0


def require_parity(report: dict) -> None:
    if report["passed"]:
        return
    bad = [f"{r} max |delta| {d:.2e} > {report['tolerance'][r]:.0e}" for r, d in report["max_abs_delta"].items()
           if d > report["tolerance"][r]]
    for name in ("greedy", "beam"):
        if report[f"{name}_identical"] < 1.0:
            bad.append(f"{name} captions identical for {report[f'{name}_identical']:.0%} of {report['samples']} inputs")
    raise EdgecapError("fp32 parity gate failed, no bundle written: " + "; ".join(bad))
