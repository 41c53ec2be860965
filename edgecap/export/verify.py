"""The parity gate: the exported bundle must caption as the PyTorch model does.

On a fixed set of inputs both sides run. The inputs are, in order: --data; the data the
checkpoint was trained on (its stored training config names it: Karpathy json + images / features, or the synthetic world, found beside the
checkpoint); for a synthetic-world checkpoint whose world is gone, a few fresh scenes of the
same world generated on the spot; only then seeded random inputs, which the report and the
command's output flag (`random_inputs`), since a CIDEr-D delta over noise says nothing about
caption quality. Per graph and caption:
- per graph, max |onnxruntime - PyTorch| on its outputs when it is fed PyTorch's inputs (its own
  error, not the one it inherits): visual features (with `feature_scale`, their largest
  magnitude), cross tensors, and the step's log-probs along PyTorch's greedy path (the
  bundle's step is fed the tokens and cross state PyTorch had);
- greedy and beam captions of the whole bundle, each graph on the bundle's own intermediate
  results (`Bundle.decode`), compared token by token with PyTorch's (`generate`);
- for image bundles, the visual graph alone: beam captions of PyTorch's encoder and decoder on
  the bundle's features (`visual_beam_identical`), so a reduced-precision front end reports
  what it costs in captions separately from the rest of the bundle;
- the CIDEr-D of both sides' beam captions against the data's references, or against the
  PyTorch captions when there are none.
fp32 must match exactly (every caption token-identical, graph deltas within the spec's
tolerances; visual features relative to their scale) or the export fails; fp16 / int8 report
how close they came. One exception, counted in the report (`greedy_ties`, `beam_ties`): a
caption that differs only because fp32 rounding broke a near-tie in the search the other way.
It is recognised by replaying the bundle's own search, its tokens and beam reorders, through
PyTorch's decoder from the same cross tensors: when every log-prob the bundle's step returned
on that path is within the step's tolerance of PyTorch's, the two decoders compute the same
numbers and only a comparison closer than rounding decided differently. (An untrained model's
beams are full of such near-ties; which way they fall moves with the CPU's kernels, so a gate
that demanded identity there failed on one CPU and passed on another.) A wrong cache write or
beam reorder puts the bundle's numbers off PyTorch's along its path and still fails.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import torch

from edgecap.config_paths import from_run_start
from edgecap.contract.beam import DecodeOptions, beam_search
from edgecap.contract.preprocess import preprocess_as
from edgecap.data.features import FeatureStore
from edgecap.data.karpathy import find_image, missing_image
from edgecap.data.synth import generate_dataset
from edgecap.data.synth.dataset import is_world_of
from edgecap.errors import EdgecapError
from edgecap.export.specs.base import ExportSpec
from edgecap.jsonio import read_json
from edgecap.metrics.ciderd import CiderD
from edgecap.models.decoding import CachedStepper, generate
from edgecap.runtime.session import Bundle

DATA_META_KEYS = ("data_dir", "data", "dataset")
ONE_CAPTION_INPUTS = 4


@dataclass
class ParityInputs:
    batches: list[tuple[torch.Tensor, ...]]  # model inputs, each exactly the static batch
    count: int  # real samples (the last batch may be padded with copies)
    source: str
    refs: list[list[str]] | None = None
    ids: list = field(default_factory=list)
    random: bool = False  # no data was found: seeded noise, so CIDEr-D says nothing about quality


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


@dataclass
class ParityData:
    """Where the parity gate's images (or features) and reference captions come from."""

    karpathy: Path  # dataset_coco.json
    images: Path | None  # image root: <images>/<filepath>/<filename>, or COCO 2017's names (find_image)
    features: Path | None  # HDF5 with <image_id>_features
    label: str
    any_split: bool = False  # a freshly generated world: every image is unseen


def _data_dir(path: Path, label: str, features: str = "") -> ParityData:
    """A dataset folder: dataset_coco.json plus images/ (the `edgecap data synth` layout) or the
    image root itself (COCO's train2014/ and val2014/ beside the json)."""
    karpathy = path / "dataset_coco.json"
    if not karpathy.is_file():
        raise EdgecapError(f"parity data {path}: no dataset_coco.json")
    images = _data_dir_images(path)
    h5 = Path(features) if features else path / "features.h5"
    return ParityData(karpathy, images, h5, label)


def _data_dir_images(folder: Path) -> Path | None:
    if (folder / "images").is_dir():
        return folder / "images"
    return folder if folder.is_dir() else None


def find_parity_data(data: str = "", meta: dict | None = None,
                     checkpoint: Path | None = None) -> tuple[ParityData | None, dict | None, list[str]]:
    """(data found, synthetic-world settings to regenerate from, places looked at).

    In order: --data; a data dir the checkpoint's meta names; the data of the training config
    stored in the checkpoint (Karpathy json + images or features as given, or the synthetic
    world in [data.synth].dir, <run dir>/data beside the checkpoint, or [run].out/data).
    """
    meta = meta or {}
    if data:
        return _data_dir(Path(data), f"--data {data}", meta.get("features", "")), None, []
    named = next((str(meta[k]) for k in DATA_META_KEYS if meta.get(k)), "")
    looked: list[str] = []
    if named:
        if Path(named).is_dir():
            return _data_dir(Path(named), f"the checkpoint's data {named}", meta.get("features", "")), None, []
        looked.append(named)
    train = (meta.get("train_config") or {}).get("data") or {}
    synth = train.get("synth")
    at = partial(from_run_start, started_in=meta.get("train_cwd"))
    if train.get("karpathy") and not synth:
        karpathy = at(train["karpathy"])
        # a run on cached features names no images; an export that attaches the front end
        # needs them: those beside dataset_coco.json, as `--data DIR` would take them
        images = at(train["images"]) if train.get("images") else _data_dir_images(karpathy.parent)
        features = at(train["features"]) if train.get("features") else None
        if karpathy.is_file() and ((images and images.is_dir()) or (features and features.is_file())):
            return ParityData(karpathy, images, features, f"the training data {karpathy}"), None, []
        looked.append(str(karpathy))
    if synth:
        run_out = ((meta.get("train_config") or {}).get("run") or {}).get("out")
        candidates = [at(synth["dir"])] if synth.get("dir") else []
        if checkpoint is not None:
            candidates.append(checkpoint.parent / "data")
        if run_out:
            candidates.append(at(run_out) / "data")
        for root in dict.fromkeys(candidates):
            if is_world_of(root, synth):
                return _data_dir(root, f"the training world {root}"), None, []
            looked.append(str(root))
        return None, synth, looked
    return None, None, looked


def _dataset_items(found: ParityData, n: int) -> list[dict]:
    doc = read_json(found.karpathy, where=f"parity data {found.karpathy}")
    images = doc.get("images") if isinstance(doc, dict) else None
    if not isinstance(images, list):
        raise EdgecapError(f"parity data {found.karpathy}: not a Karpathy dataset JSON (no 'images' list)")
    if not found.any_split:  # held-out images first, training images only to fill up
        order = {"val": 0, "test": 1, "restval": 2, "train": 3}
        images = sorted((im for im in images if im.get("split") in order), key=lambda im: order[im["split"]])
    if not images:
        raise EdgecapError(f"parity data {found.karpathy}: no images")
    return images[:n]


def _refs(items: list[dict]) -> list[list[str]]:
    return [[" ".join(s.get("tokens") or s.get("raw", "").lower().split()) for s in im.get("sentences", [])]
            for im in items]


def _dataset_inputs(spec: ExportSpec, found: ParityData, n: int) -> ParityInputs:
    items = _dataset_items(found, n)
    if spec.takes_images:
        if found.images is None:
            raise EdgecapError(f"parity data {found.label}: the model reads images but the data has none "
                               f"(pass --data DIR: a dataset_coco.json with its images)")
        pre = spec.preprocessing()
        arrays = []
        for im in items:
            rel = find_image(found.images, im)
            if rel is None:
                raise EdgecapError(f"parity data: {missing_image(found.images, im)}")
            path = found.images / rel
            bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if bgr is None:
                raise EdgecapError(f"parity data: cannot read image {path}")
            arrays.append(preprocess_as(bgr, pre))
        inputs = (torch.from_numpy(np.stack(arrays)), *spec.extra_inputs(len(items)))
    else:
        if found.features is None:
            raise EdgecapError(f"parity data {found.label}: the model reads features but the data has no HDF5 file")
        with FeatureStore(found.features, n_regions=spec.cfg.n_regions) as store:
            feats, mask = store.get_batch([im.get("cocoid", im.get("id")) for im in items])
        inputs = (torch.from_numpy(feats), torch.from_numpy(mask), *spec.extra_inputs(len(items)))
    refs = _refs(items)
    return ParityInputs(_batches(inputs, spec.batch), len(items), f"{found.label} ({len(items)} images)",
                        refs if all(refs) else None, [im.get("cocoid", im.get("id")) for im in items])


def _fresh_world_inputs(spec: ExportSpec, n: int, synth: dict) -> ParityInputs:
    """`n` unseen scenes of the checkpoint's own synthetic world (its size and image format, the
    next seed), generated into a temporary folder: real images with real references."""
    seed = int(synth.get("seed", 0)) + 1
    size, fmt = int(synth.get("size", 64)), str(synth.get("image_format", "jpg"))
    with tempfile.TemporaryDirectory(prefix="edgecap-parity-") as tmp:
        root = Path(tmp) / "world"
        generate_dataset(root, n, seed=seed, size=size, sequences=0, video_frames=0, image_format=fmt,
                         progress=False)
        found = ParityData(root / "dataset_coco.json", root / "images", None,
                           f"a fresh synthetic world like the training one (seed {seed}, {size} px, "
                           f"{fmt}; the training world was not found)", any_split=True)
        return _dataset_inputs(spec, found, n)


def load_parity_inputs(spec: ExportSpec, n: int, data: str = "", meta: dict | None = None,
                       seed: int = 0, checkpoint: Path | None = None) -> ParityInputs:
    found, synth, looked = find_parity_data(data, meta, checkpoint)
    if found is not None:
        return _dataset_inputs(spec, found, n)
    if synth is not None and spec.takes_images:
        return _fresh_world_inputs(spec, n, synth)
    source = f"random inputs (seed {seed})"
    if looked:
        source += f"; no data at {', '.join(looked)}"
    return ParityInputs(_batches(spec.random_inputs(n, seed), spec.batch), n, source, random=True)


# -- comparisons ------------------------------------------------------------------------------
def _max_delta(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == bool or b.dtype == bool:
        return float(np.any(a != b))
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def feature_cosine(a, b, centre=None) -> float:
    """Mean cosine similarity of the feature vectors (the last axis) of `a` and `b`, after
    subtracting `centre` from both when given. Centred on the mean feature of a set of images,
    it measures what tells those images apart: a random-weight backbone gives every image
    nearly the same features, and their plain cosine is near 1 whatever the error."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if centre is not None:
        a, b = a - centre, b - centre
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return float(np.mean(np.einsum("ij,ij->i", a, b) / np.maximum(norms, 1e-30))) if a.size else 1.0


@torch.no_grad()
def caption_agreement(model, features: list[tuple], beam: int) -> float:
    """The share of images whose best beam caption by the PyTorch model is the same on two
    versions of their features: `features` holds (feats_a, mask_a, feats_b, mask_b) numpy
    batches."""
    options = DecodeOptions(beam_size=beam, max_len=model.cfg.max_len)
    same = []
    for feats_a, mask_a, feats_b, mask_b in features:
        hyp_a = generate(model, torch.from_numpy(feats_a), torch.from_numpy(mask_a), options)
        hyp_b = generate(model, torch.from_numpy(feats_b), torch.from_numpy(mask_b), options)
        same += [x == y for x, y in zip(_sequences(hyp_a.tokens, hyp_a.lengths),
                                        _sequences(hyp_b.tokens, hyp_b.lengths), strict=True)]
    return float(np.mean(same)) if same else 1.0


def _sequences(tokens: np.ndarray, lengths: np.ndarray) -> list[tuple[int, ...]]:
    best, lens = np.asarray(tokens)[:, 0], np.asarray(lengths)[:, 0]
    return [tuple(int(t) for t in row[: int(n)]) for row, n in zip(best, lens, strict=False)]


class _Mirror:
    """The bundle's stepper, with PyTorch's fed the same tokens and beam reorders: how far
    PyTorch's log-probs are from the bundle's top-k along the bundle's own search path."""

    def __init__(self, bundle_stepper, torch_stepper):
        self.bundle, self.torch, self.delta = bundle_stepper, torch_stepper, 0.0

    def top_k(self, tokens: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        vals, idx = self.bundle.top_k(tokens, t, k)
        theirs = np.take_along_axis(self.torch(tokens, t), idx, axis=1)
        self.delta = max(self.delta, _max_delta(theirs, vals))
        return vals, idx

    def reorder(self, rows: np.ndarray) -> None:
        self.bundle.reorder(rows)
        self.torch.reorder(rows)


def _search_path_delta(spec: ExportSpec, bundle: Bundle, feats: np.ndarray, mask: np.ndarray, extra,
                       options: DecodeOptions) -> float:
    """Max |bundle - PyTorch| of the step's top-k log-probs along the bundle's own search on
    `feats`, both decoders fed the same tokens, reorders and cross tensors (PyTorch's encoder
    on these features)."""
    model, cfg = spec.model, spec.cfg
    cross = model.encode(torch.from_numpy(feats), torch.from_numpy(mask), *extra)
    mirror = _Mirror(bundle.stepper(_numpy(spec.flat_cross(cross)), options.beam_size),
                     CachedStepper(model, cross, spec.batch * options.beam_size))
    beam_search(mirror, spec.batch, options, cfg.bos_id, cfg.eos_id, cfg.pad_id)
    return mirror.delta


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


def _numpy(tensors) -> tuple:
    return tuple(np.ascontiguousarray(t.numpy()) for t in tensors)


@torch.no_grad()
def parity_gate(spec: ExportSpec, bundle: Bundle, inputs: ParityInputs, precision: str, vocab) -> dict:
    """Run both sides on `inputs`; -> the parity report (see the module docstring)."""
    model, cfg = spec.model, spec.cfg
    k = bundle.beam_size
    deltas = {"visual": 0.0, "encoder": 0.0, "decoder_step": 0.0}
    cosines = {"visual": [], "encoder": []}  # each graph's float outputs against PyTorch's (fp32)
    feature_scale = 0.0
    seqs = {"greedy": ([], []), "beam": ([], []), "visual": ([], [])}
    ties = {"greedy": [], "beam": []}  # per input: differs only by a near-tie rounding broke (above)
    beam_options = DecodeOptions(beam_size=k, max_len=bundle.max_len)
    extra_kw = {}
    for batch in inputs.batches:
        feats_t, mask_t = spec.features(batch)
        front, extra = spec.split(batch)
        extra_kw = {"extra": extra} if extra else {}
        extra_np = _numpy(extra)
        # each graph on PyTorch's inputs: its own error, not the one it inherits
        cross_t = model.encode(feats_t, mask_t, *extra)
        cross_flat = _numpy(spec.flat_cross(cross_t))
        for a, b in zip(cross_flat, bundle.encode(*_numpy((feats_t, mask_t)), *extra_np), strict=True):
            deltas["encoder"] = max(deltas["encoder"], _max_delta(a, b))
            if np.issubdtype(a.dtype, np.floating):
                cosines["encoder"].append(feature_cosine(a, b))
        if bundle.has_visual:
            feats_b, mask_b = bundle.visual(front[0].numpy())
            deltas["visual"] = max(deltas["visual"], _max_delta(feats_t, feats_b), _max_delta(mask_t, mask_b))
            cosines["visual"].append(feature_cosine(feats_t.numpy(), feats_b))
            feature_scale = max(feature_scale, float(feats_t.abs().max()))
            # the visual graph alone: its features through PyTorch's encoder and decoder
            hyp_v = generate(model, torch.from_numpy(feats_b), torch.from_numpy(mask_b), beam_options, **extra_kw)
            seqs["visual"][1].extend(_sequences(hyp_v.tokens, hyp_v.lengths))
        else:
            feats_b, mask_b = front[0].numpy(), front[1].numpy()
        # end to end: every graph on the bundle's own intermediate results
        cross_b = bundle.encode(feats_b, mask_b, *extra_np)
        for name, beam in (("greedy", 1), ("beam", k)):
            options = DecodeOptions(beam_size=beam, max_len=bundle.max_len)
            if name == "greedy":  # what `generate` does, recording PyTorch's log-probs on the way
                recorded = _Recorder(CachedStepper(model, cross_t, spec.batch))
                hyp_t = beam_search(recorded, spec.batch, options, cfg.bos_id, cfg.eos_id, cfg.pad_id)
                step_delta = _replay_delta(recorded, bundle.stepper(cross_flat, beam=1))
                deltas["decoder_step"] = max(deltas["decoder_step"], step_delta)
            else:
                hyp_t = generate(model, feats_t, mask_t, options, **extra_kw)
                if bundle.has_visual:
                    seqs["visual"][0].extend(_sequences(hyp_t.tokens, hyp_t.lengths))
            hyp_b = bundle.decode(cross_b, options)
            torch_seqs, bundle_seqs = _sequences(hyp_t.tokens, hyp_t.lengths), _sequences(hyp_b.tokens, hyp_b.lengths)
            tie = torch_seqs != bundle_seqs and _search_path_delta(
                spec, bundle, feats_b, mask_b, extra, options) <= spec.tolerances()["decoder_step"]
            seqs[name][0].extend(torch_seqs)
            seqs[name][1].extend(bundle_seqs)
            ties[name].extend(tie and a != b for a, b in zip(torch_seqs, bundle_seqs, strict=True))
    n = inputs.count
    report: dict = {
        "precision": precision,
        "inputs": inputs.source,
        "random_inputs": inputs.random,
        "samples": n,
        "max_abs_delta": {role: deltas[role] for role in ("visual", "encoder", "decoder_step")
                          if role != "visual" or bundle.has_visual},
    }
    report["feature_cosine"] = {role: min(c) for role, c in cosines.items() if c}  # the worst batch
    if bundle.has_visual:
        report["feature_scale"] = feature_scale
    report.update(_criteria(spec.tolerances(), report, precision))
    for name, (ts, bs) in seqs.items():
        if name == "visual" and not bundle.has_visual:
            continue
        same = [a == b for a, b in zip(ts[:n], bs[:n], strict=False)]
        key = "visual_beam_identical" if name == "visual" else f"{name}_identical"
        report[key] = float(np.mean(same)) if same else 1.0
        if name in ties and any(ties[name][:n]):
            report[f"{name}_ties"] = int(sum(ties[name][:n]))
    report["beam_size"] = k
    report.update(_cider(seqs["beam"][0][:n], seqs["beam"][1][:n], inputs.refs, vocab, bundle))
    report["passed"] = _passed(report, precision)
    return report


def _cider(torch_seqs, bundle_seqs, refs, vocab, bundle) -> dict:
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
    distinct = len(set(cands_t))
    # "100% identical" means nothing when the model says the same thing to every input (with
    # a few inputs that can be chance: flagged from ONE_CAPTION_INPUTS on)
    return {"cider_references": source, "cider_pytorch": float(cider_t), "cider_bundle": float(cider_b),
            "cider_delta": float(cider_b - cider_t), "distinct_captions": distinct,
            "one_caption_for_all": distinct == 1 and len(cands_t) >= ONE_CAPTION_INPUTS}


def _criteria(tolerances: dict, report: dict, precision: str) -> dict:
    """What the gate checked, as it checked it. fp32: each graph's tolerance as the spec states
    it (`tolerance`, visual relative to the feature scale) and the absolute bound that rule
    gives for these inputs (`tolerance_checked`, what `max_abs_delta` is compared with).
    Reduced precision is not held to fp32's bounds: it records that it is reported, not gated."""
    if precision != "fp32":
        return {"criteria": f"{precision}: reported, not gated; caption agreement (greedy / beam identical) and "
                            f"the CIDEr-D delta say what the precision costs"}
    checked = {role: _allowed(tolerances, report, role) for role in report["max_abs_delta"]}
    rule = "every caption token-identical; each max_abs_delta <= tolerance_checked"
    if "visual" in checked:
        rule += "; visual: tolerance.visual x max(1, feature_scale) (fp32 rounding grows with the features' magnitude)"
    return {"criteria": rule, "tolerance": tolerances, "tolerance_checked": checked}


def _allowed(tolerances: dict, report: dict, role: str) -> float:
    """The largest fp32 |delta| accepted for a graph. Visual features are compared relative to
    their magnitude once it exceeds 1 (a CNN's last feature map reaches tens): fp32 rounding
    through fifty layers is relative, so an absolute bound would fail a backbone for its scale."""
    tol = tolerances[role]
    return tol * max(1.0, report.get("feature_scale", 1.0)) if role == "visual" else tol


def allowed_delta(report: dict, role: str) -> float:
    """The absolute bound an fp32 report's `role` was checked against."""
    return report["tolerance_checked"][role]


def _passed(report: dict, precision: str) -> bool:
    if precision != "fp32":
        return True  # reduced precision is reported, not gated
    within = all(report["max_abs_delta"][r] <= allowed_delta(report, r) for r in report["max_abs_delta"])
    return within and not _mismatches(report)


def _mismatches(report: dict) -> list[str]:
    """The caption comparisons that fail the fp32 gate: not identical, near-ties aside."""
    bad = []
    for key, what in (("greedy_identical", "greedy"), ("beam_identical", "beam"),
                      ("visual_beam_identical", "beam (bundle features, PyTorch decoder)")):
        if key not in report or report[key] == 1.0:
            continue
        differ = round((1.0 - report[key]) * report["samples"])
        ties = report.get(key.replace("_identical", "_ties"), 0)
        if differ > ties:
            tied = f", {ties} of them near-ties rounding broke the other way" if ties else ""
            bad.append(f"{what} captions identical for {report[key]:.0%} of {report['samples']} inputs{tied}")
    return bad


def require_parity(report: dict) -> None:
    if report["passed"]:
        return
    bad = [f"{r} max |delta| {d:.2e} > {allowed_delta(report, r):.1e}" for r, d in report["max_abs_delta"].items()
           if d > allowed_delta(report, r)]
    bad += _mismatches(report)
    raise EdgecapError("fp32 parity gate failed, no bundle written: " + "; ".join(bad))
