"""Caption latency vs batch size across models and backends, against the hardware limit.

    python benchmarks/latency.py [--models smart,smart-nomem,pma-edge,m2,transformer,updown]
        [--backends m2-official,torch-nocache,torch,onnxruntime,onnxruntime-int8,tensorrt,onnxruntime-int8-wo]
        [--batch-sizes 1,2,4,8,16,32,64] [--beam 1,3,5] [--repeats N] [--out DIR] [--quick] [--append]

Reproduces and extends Fig. 3 of the SMArT paper. Every backend gets the same weights (random,
paper-default sizes, fixed seed) and the same inputs; captions are forced to the full max length
so every backend does the same number of steps (`--stop-at-eos` lets them stop at EOS instead).
Each row: median and p10/p90 of the whole batch's time after warm-up, split into encoder and
decode, ms per caption, captions/s, the ratio to the measured lower bound of this machine, and
for the static-cache decoders the mean time per step split into graph (the decoder step itself),
cache write, beam reorder and search (the host's beam search around them). `m2-official` is
the official M² code's own beam search on the same weights (_official_m2.py: cross keys and
values projected again every step for every beam, every state gathered after every step; M²-
structured models only); `torch-nocache` re-runs the whole prefix every step over cached cross
keys and values, full-precision weights. The tables report every backend's speed-up over both.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, Breakdown, host_info, print_table, summary, timed, write_csv, write_json  # noqa: E402
from _roofline import (  # noqa: E402
    matmul_throughput,
    memory_bandwidth,
    step_bound_kind,
    step_bound_seconds,
    step_cost,
    step_limits,
)

from edgecap.argtypes import BATCH, BEAM, COUNT, THREADS, Integer, ListOf, Parser  # noqa: E402

MAX_LEN = Integer(2, 512)        # caption tokens of the timed decode
VOCAB = Integer(8, 1_000_000)    # words of the timed models (above the special tokens)

ALL_MODELS = ("smart", "smart-nomem", "pma-edge", "m2", "transformer", "updown")
EXTRA_MODELS = ("rat", "acf")
COLORS = ("tab:pink", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
          "tab:olive")  # one per backend, every plot
# onnxruntime-int8-wo: the bundle of `export --quantize weight-only` (the step's MatMulNBits), not in the default
# sweep; onnxruntime-device: the fp32 bundle with its decoding state as onnxruntime tensors and the cache_update
# graph (the GPU's path, Bundle.load(device_state=True)) on the CPU provider, beside the host path
ALL_BACKENDS = ("m2-official", "torch-nocache", "torch", "onnxruntime", "onnxruntime-int8", "tensorrt",
                "onnxruntime-int8-wo", "onnxruntime-device")
# the references every other backend's speed-up is reported against, with their column names
REFERENCES = {"m2-official": "official", "torch-nocache": "prefix re-run"}
QUANTIZE = {"onnxruntime-int8": "dynamic", "onnxruntime-int8-wo": "weight-only"}
QUICK = {"models": "smart,m2", "batch_sizes": "2", "beam": "1,3"}  # tiny models: seconds, not minutes
PARTS = ("graph", "write", "reorder")  # timed per step; search = the decode time left over


@dataclass
class Setting:
    model: str
    backend: str
    batch: int
    beam: int


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=None, help=f"default {','.join(ALL_MODELS)} ({QUICK['models']} with --quick)")
    p.add_argument("--backends", default="m2-official,torch-nocache,torch,onnxruntime,onnxruntime-int8,tensorrt")
    p.add_argument("--batch-sizes", type=ListOf(BATCH), default=None, help=f"default 1,2,4,8,16,32,64 ({QUICK['batch_sizes']} with --quick)")
    p.add_argument("--beam", type=ListOf(BEAM), default=None, help=f"default 1,3,5 ({QUICK['beam']} with --quick)")
    p.add_argument("--repeats", type=COUNT, default=5)
    p.add_argument("--warmup", type=Integer(0), default=1)
    p.add_argument("--max-len", type=MAX_LEN, default=20)
    p.add_argument("--vocab", type=VOCAB, default=10000)
    p.add_argument("--stop-at-eos", action="store_true", help="let captions end at EOS (default: full length)")
    p.add_argument("--threads", type=THREADS, default=None, help="intra-op threads for torch and onnxruntime")
    p.add_argument("--no-spin", action="store_true",
                   help="onnxruntime's intra-op threads sleep between ops instead of spinning (Bundle.load(spin=False))")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "latency"))
    p.add_argument("--retrieval-images", type=COUNT, default=20000,
                   help="images in the RA-Transformer retrieval index whose search time is added to rat rows")
    p.add_argument("--quick", action="store_true", help="tiny models, few settings: keeps the script working in tests")
    p.add_argument("--replot", action="store_true",
                   help="re-render latency.md and the plots from OUT/latency.json without measuring")
    p.add_argument("--append", action="store_true",
                   help="merge into OUT/latency.json (a row replaces the one with the same model, backend, batch and beam), "
                        "so a long sweep can run in parts")
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else {"models": ",".join(ALL_MODELS), "batch_sizes": "1,2,4,8,16,32,64", "beam": "1,3,5"}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    args.models, args.backends = split(args.models), split(args.backends)
    # the defaults are strings, a flag's value is already a list
    args.batch_sizes = ListOf(BATCH)(args.batch_sizes) if isinstance(args.batch_sizes, str) else args.batch_sizes
    args.beams = ListOf(BEAM)(args.beam) if isinstance(args.beam, str) else args.beam
    for m in args.models:
        if m not in ALL_MODELS + EXTRA_MODELS:
            p.error(f"unknown model {m!r}; choose from {', '.join(ALL_MODELS + EXTRA_MODELS)}")
    for b in args.backends:
        if b not in ALL_BACKENDS:
            p.error(f"unknown backend {b!r}; choose from {', '.join(ALL_BACKENDS)}")
    if args.quick:
        args.repeats, args.warmup = min(args.repeats, 2), 1
    return args


def model_overrides(name: str, args) -> dict:
    over = {"vocab_size": args.vocab, "max_len": args.max_len, "dropout": 0.0}
    if args.quick:
        over.update(d_model=64, n_heads=4, d_ff=128, d_in=64, n_regions=10, vocab_size=200, max_len=8)
        if name.startswith("pma"):
            over["prototype"] = {"count": 32}
        if name == "updown":
            over["lstm"] = {"hidden": 64, "embed": 64, "attention_hidden": 32}
        if name == "rat":
            over["retrieval"] = {"k": 3, "length": 6}
        if name == "acf":
            over.update(n_regions=16, clustering={"grid_w": 4})
    return over


def build_model(name: str, args):
    import torch

    from edgecap.models import build

    torch.manual_seed(0)
    model = build(name, **model_overrides(name, args)).eval()
    if model.cfg.decoder_self_attention == "prototype":
        # Frozen random prototypes: the benchmark measures their cost, not their content.
        g = torch.Generator().manual_seed(1)
        for layer in model.layers:
            m, d = layer.self_attn.proto_k.shape
            layer.self_attn.set_prototypes(torch.randn(m, d, generator=g), torch.randn(m, d, generator=g))
    return model


def inputs(model, batch: int):
    """features, mask and any extra encoder inputs (RA-T's retrieved captions), seeded."""
    import torch

    torch.manual_seed(2)
    cfg = model.cfg
    feats = torch.randn(batch, cfg.n_regions, cfg.d_in)
    mask = torch.ones(batch, cfg.n_regions, dtype=torch.bool)
    return feats, mask, tuple(model.encode_extra_example(batch))


class RetrievalTimer:
    """Host-side retrieval of RA-T (embedding + FAISS search), as the runtime does it before
    the encoder: an index over `images` random unit embeddings, the bundle's index kind."""

    def __init__(self, dim: int, images: int, k: int):
        import numpy as np

        from edgecap.retrieval.index import CaptionIndex

        rng = np.random.default_rng(3)
        emb = rng.standard_normal((images, dim)).astype(np.float32)
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        self.k = k
        self.index = CaptionIndex.build(emb, [str(i) for i in range(images)], [["a"]] * images, k=k)

    def seconds(self, feats, mask, repeats: int, warmup: int) -> list[float]:
        from edgecap.retrieval.embedding import image_embeddings

        f, m = feats.numpy(), mask.numpy()
        return timed(lambda: self.index.search(image_embeddings(f, m), self.k), repeats, warmup)


class TorchRunner:
    def __init__(self, model, feats, mask, extra, beam, options, use_cache: bool):
        self.model, self.feats, self.mask, self.beam, self.options = model, feats, mask, beam, options
        self.extra = extra
        self.use_cache = use_cache
        self.cross = None
        self.breakdown = Breakdown(PARTS) if use_cache else None

    def encode(self):
        import torch

        with torch.no_grad():
            self.cross = self.model.encode(self.feats, self.mask, *self.extra)

    def decode(self):
        from edgecap.contract.beam import beam_search
        from edgecap.models.decoding import CachedStepper, PrefixStepper

        cfg = self.model.cfg
        rows = self.feats.shape[0] * self.beam
        if self.use_cache:
            stepper = CachedStepper(self.model, self.cross, rows)
            stepper.compute = self.breakdown.wrap("graph", stepper.compute)
            stepper.write = self.breakdown.wrap("write", stepper.write)
            stepper.reorder = self.breakdown.wrap("reorder", stepper.reorder)
        else:
            stepper = PrefixStepper(self.model, self.cross, rows, self.beam)
        return beam_search(stepper, self.feats.shape[0], self.options, cfg.bos_id, cfg.eos_id, cfg.pad_id)


class OfficialRunner:
    """The official M² code's beam search (_official_m2.py); like the official code it always
    runs max_len steps, finished beams frozen."""

    def __init__(self, model, feats, mask, beam):
        from _official_m2 import OfficialM2Decoding

        self.decoding = OfficialM2Decoding(model, beam, model.cfg.max_len)
        self.feats, self.mask = feats, mask

    def encode(self):
        self.decoding.encode(self.feats, self.mask)

    def decode(self):
        return self.decoding.decode()


class BundleRunner:
    """The exported bundle through edgecap.runtime (onnxruntime or TensorRT), as `Bundle.decode`
    runs it: one stepper per beam size, reset for every batch of images."""

    def __init__(self, bundle, feats, mask, extra, options):
        self.bundle, self.options = bundle, options
        self.feats, self.mask = feats.numpy(), mask.numpy()
        self.extra = tuple(e.numpy() for e in extra)
        self.cross = None
        self.stepper = None
        self.breakdown = Breakdown(PARTS)

    def encode(self):
        self.cross = self.bundle.encode_for_decoding(self.feats, self.mask, *self.extra)

    def decode(self):
        from edgecap.contract.beam import beam_search

        b = self.bundle
        if self.stepper is None:
            # the same three parts on either stepper (edgecap.runtime.steppers); on the device
            # path `write` is the cache_update graph, which also reorders the beams
            self.stepper = b.stepper(self.cross, self.options.beam_size)
            for method, part in (("run", "graph"), ("write", "write"), ("reorder", "reorder")):
                setattr(self.stepper, method, self.breakdown.wrap(part, getattr(self.stepper, method)))
        else:
            self.stepper.reset(self.cross)
        return beam_search(self.stepper, b.batch_size, self.options, b.bos_id, b.eos_id, b.pad_id)


def export_bundle(model, name, batch, beam, precision, engine, workdir: Path, threads, spin=True,
                  quantize: str | None = None, device_state: bool | None = None):
    """Export the same weights as a bundle (int8: `quantize` as export's --quantize); returns
    (Bundle, None) or (None, reason)."""
    from edgecap.contract.vocab import Vocab
    from edgecap.errors import EdgecapError
    from edgecap.export.bundle import export_bundle as export
    from edgecap.export.formats import resolve_settings
    from edgecap.models.checkpoint import save_checkpoint
    from edgecap.runtime.session import Bundle

    ckpt = workdir / f"{name}.pt"
    if not ckpt.exists():
        vocab = Vocab(["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(model.cfg.vocab_size - 4)])
        save_checkpoint(ckpt, model, vocab)
    form = f"{precision}-{quantize}" if quantize else precision
    out = workdir / f"{name}-{engine}-{form}-b{batch}-k{beam}"
    try:
        if not out.exists():
            # One parity sample: the gate still refuses a wrong fp32 bundle, at little cost.
            settings = resolve_settings({"engine": engine, "batch": batch, "beam": beam, "precision": precision,
                                         "samples": 1, "out": str(out), **({"quantize": quantize} if quantize else {})})
            export(ckpt, settings, progress=False)
        return Bundle.load(out, threads=threads, spin=spin, device_state=device_state), None
    except (EdgecapError, ImportError) as exc:
        return None, str(exc).splitlines()[0][:120]


def run_setting(s: Setting, model, args, workdir: Path, bound: dict, retrieval: RetrievalTimer | None) -> dict:
    from edgecap.contract.beam import DecodeOptions

    row = {"model": s.model, "backend": s.backend, "batch": s.batch, "beam": s.beam}
    options = DecodeOptions(beam_size=s.beam, max_len=model.cfg.max_len, stop_at_eos=args.stop_at_eos)
    feats, mask, extra = inputs(model, s.batch)
    if s.backend == "m2-official":
        from _official_m2 import supports

        reason = supports(model.cfg)
        if reason:
            return {**row, "status": "skipped", "reason": reason}
        runner = OfficialRunner(model, feats, mask, s.beam)
    elif s.backend in ("torch", "torch-nocache"):
        if s.backend == "torch-nocache" and model.cfg.decoder == "lstm":
            return {**row, "status": "skipped", "reason": "an LSTM has no prefix to re-run"}
        runner = TorchRunner(model, feats, mask, extra, s.beam, options, use_cache=s.backend == "torch")
    else:
        engine = "trt" if s.backend == "tensorrt" else "onnx"
        if engine == "trt" and importlib.util.find_spec("tensorrt") is None:
            return {**row, "status": "skipped", "reason": "tensorrt is not installed (needs an NVIDIA GPU)"}
        precision = "int8" if s.backend in QUANTIZE else ("fp16" if engine == "trt" else "fp32")
        bundle, reason = export_bundle(model, s.model, s.batch, s.beam, precision, engine, workdir, args.threads,
                                       spin=not args.no_spin, quantize=QUANTIZE.get(s.backend),
                                       device_state=True if s.backend == "onnxruntime-device" else None)
        if bundle is None:
            return {**row, "status": "skipped", "reason": reason}
        runner = BundleRunner(bundle, feats, mask, extra, options)
    enc = timed(runner.encode, args.repeats, args.warmup)
    timed(runner.decode, 0, args.warmup)
    breakdown = getattr(runner, "breakdown", None)
    if breakdown is not None:
        breakdown.reset()
    dec = timed(runner.decode, args.repeats, 0)
    ret = retrieval.seconds(feats, mask, args.repeats, args.warmup) if retrieval else [0.0] * len(enc)
    total = [a + b + c for a, b, c in zip(enc, dec, ret, strict=False)]
    st = summary(total)
    per_caption = st["median_ms"] / s.batch
    # int8 graphs read one byte per quantized weight instead of four
    weight_scale = 0.25 if s.backend in QUANTIZE else 1.0
    cost = bound["step_cost"][(s.batch, s.beam)]
    step_s = step_bound_seconds(cost, bound["bandwidth"], bound["flops"], weight_scale)
    bound_ms = 1e3 * (bound["encoder_s"] * s.batch + step_s * model.cfg.max_len)
    parts = {}
    if breakdown is not None and breakdown.steps:
        n = breakdown.steps
        step_ms = sum(dec) * 1e3 / n
        parts = {f"{k}_ms": v * 1e3 / n for k, v in breakdown.seconds.items()}
        parts["search_ms"] = step_ms - sum(parts.values())
        parts.update(step_ms=step_ms, step_bound_ms=step_s * 1e3, step_ratio=step_ms / (step_s * 1e3),
                     step_bound_kind=step_bound_kind(cost, bound["bandwidth"], bound["flops"], weight_scale))
        # the two limits added: what a step costs when its memory-bound and compute-bound
        # operators run one after the other instead of overlapping (the bound assumes they overlap)
        moving, computing = step_limits(cost, bound["bandwidth"], bound["flops"], weight_scale)
        sum_ms = (moving + computing) * 1e3
        parts.update(step_move_ms=moving * 1e3, step_compute_ms=computing * 1e3,
                     step_sum_ratio=step_ms / sum_ms, graph_sum_ratio=parts["graph_ms"] / sum_ms)
    return {
        **row,
        "status": "ok",
        "batch_ms": st["median_ms"],
        "batch_p10_ms": st["p10_ms"],
        "batch_p90_ms": st["p90_ms"],
        "retrieval_ms": summary(ret)["median_ms"] if retrieval else None,
        "encoder_ms": summary(enc)["median_ms"],
        "decode_ms": summary(dec)["median_ms"],
        "ms_per_caption": per_caption,
        "captions_per_s": 1e3 / per_caption,
        "bound_ms": bound_ms,
        "ratio_to_bound": st["median_ms"] / bound_ms,
        "load_1m": os.getloadavg()[0],  # above the threads used: something else ran meanwhile
        **parts,
    }


def model_bound(model, settings, bandwidth, flops):
    """Lower bounds: encoder per image (FLOPs only) and one decode step per (batch, beam)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    feats, mask, extra = inputs(model, 1)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.encode(feats, mask, *extra)
    costs = {}
    for s in settings:
        key = (s.batch, s.beam)
        if key not in costs:
            costs[key] = step_cost(model, s.batch, s.beam)
    return {"encoder_s": counter.get_total_flops() / flops, "step_cost": costs, "bandwidth": bandwidth, "flops": flops}


def plot(rows, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from _common import save_png

    ok = [r for r in rows if r["status"] == "ok"]
    written = []
    for beam in sorted({r["beam"] for r in ok}):
        models = sorted({r["model"] for r in ok if r["beam"] == beam})
        cols = min(4, len(models))
        rows_n = -(-len(models) // cols)
        fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 3.4 * rows_n), squeeze=False)
        for ax in axes.flat[len(models):]:
            ax.set_visible(False)
        for ax, model in zip(axes.flat, models, strict=False):
            for backend, color in zip(ALL_BACKENDS, COLORS, strict=False):
                pts = sorted((r["batch"], r["ms_per_caption"]) for r in ok if r["model"] == model and r["backend"] == backend and r["beam"] == beam)
                if pts:
                    ax.plot(*zip(*pts, strict=False), marker="o", label=backend, color=color)
            bound = sorted({(r["batch"], r["bound_ms"] / r["batch"]) for r in ok
                            if r["model"] == model and r["beam"] == beam and r["backend"] not in QUANTIZE})
            ax.plot(*zip(*bound, strict=False), "k--", lw=1, label="hardware bound")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{model} (beam {beam})")
            ax.set_xlabel("batch size")
            ax.set_ylabel("ms per caption")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        written.append(save_png(fig, out / f"latency_vs_batch_beam{beam}.png"))
    if any(r.get("step_ms") for r in ok):
        written.append(plot_steps(ok, out, plt))
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for backend, color in zip(ALL_BACKENDS, COLORS, strict=False):
        pts = [(r["batch_ms"], r["captions_per_s"]) for r in ok if r["backend"] == backend]
        if pts:
            ax.scatter(*zip(*pts, strict=False), label=backend, s=18, color=color)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("latency of a batch (ms)")
    ax.set_ylabel("captions / s")
    ax.set_title("throughput vs latency (all models, batches, beams)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    written.append(save_png(fig, out / "throughput_vs_latency.png"))
    return written


def plot_steps(ok: list[dict], out: Path, plt) -> Path:
    """One decoding step against the number of decoder rows (batch x beam) per model: ms per
    step of each backend with a per-step breakdown, and each step's ratio to its own bound."""
    from _common import save_png
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    models = sorted({r["model"] for r in ok if r.get("step_ms")})
    fig, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 7.5), squeeze=False)
    for col, model in enumerate(models):
        top, bottom = axes[0][col], axes[1][col]
        for backend, color in zip(ALL_BACKENDS, COLORS, strict=False):
            pts = sorted((r["batch"] * r["beam"], r["step_ms"], r["step_ratio"]) for r in ok
                         if r["model"] == model and r["backend"] == backend and r.get("step_ms"))
            if pts:
                rows_n, ms, ratio = zip(*pts, strict=True)
                top.plot(rows_n, ms, marker="o", ms=3, label=backend, color=color)
                bottom.plot(rows_n, ratio, marker="o", ms=3, label=backend, color=color)
        bound = sorted({(r["batch"] * r["beam"], r["step_bound_ms"]) for r in ok
                        if r["model"] == model and r.get("step_ms") and r["backend"] not in QUANTIZE})
        if bound:
            top.plot(*zip(*bound, strict=True), "k--", lw=1, label="fp32 bound")
        for goal, text, where in ((1.3, "1.3x (bandwidth goal, batch 1)", "top"), (1.5, "1.5x (compute goal, batch 32)", "bottom")):
            bottom.axhline(goal, color="grey", ls=":", lw=1)
            bottom.text(0.01, goal, text, fontsize=7, va=where, color="grey", transform=bottom.get_yaxis_transform())
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FormatStrFormatter("%d"))
            ax.grid(alpha=0.3)
            ax.set_xlabel("decoder rows (batch x beam)")
        top.set_yscale("log")
        top.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        top.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        top.yaxis.set_minor_formatter(NullFormatter())
        top.set_ylabel("ms per step")
        top.set_title(f"{model}: one decoding step")
        bottom.set_ylabel("x the step's own bound")
        bottom.set_ylim(bottom=0)
        top.legend(fontsize=7)
    return save_png(fig, out / "step_vs_rows.png")


def markdown(rows: list[dict]) -> str:
    """ms per caption (x bound) per model, batch and beam, one column per backend, with the
    speed-ups over each reference (REFERENCES) measured; then the per-step breakdown."""
    ok = [r for r in rows if r["status"] == "ok"]
    backends = [b for b in ALL_BACKENDS if any(r["backend"] == b for r in ok)]
    references = [b for b in REFERENCES if b in backends]
    ratios = [(b, ref) for ref in references for b in backends
              if b not in references[: references.index(ref) + 1]]
    lines = ["| model | batch | beam | " + " | ".join(backends)
             + "".join(f" | {b} vs {REFERENCES[ref]}" for b, ref in ratios) + " |",
             "|---" * (len(backends) + len(ratios) + 3) + "|"]
    seen = sorted({(r["model"], r["batch"], r["beam"]) for r in ok}, key=setting_order)
    for model, batch, beam in seen:
        cell = {r["backend"]: r for r in ok if (r["model"], r["batch"], r["beam"]) == (model, batch, beam)}
        texts = [f"{cell[b]['ms_per_caption']:.1f} ({cell[b]['ratio_to_bound']:.1f}x)" if b in cell else "–"
                 for b in backends]
        texts += [f"{cell[ref]['ms_per_caption'] / cell[b]['ms_per_caption']:.1f}x" if ref in cell and b in cell else "–"
                  for b, ref in ratios]
        lines.append(f"| {model} | {batch} | {beam} | " + " | ".join(texts) + " |")
    steps = sorted((r for r in ok if r.get("step_ms")),
                   key=lambda r: (*setting_order((r["model"], r["batch"] * r["beam"], r["batch"])),
                                  ALL_BACKENDS.index(r["backend"])))
    if steps:
        lines += ["", "Per decoding step (mean over the timed runs, ms): the decoder step itself (graph), writing its "
                  "new slots into the cache, beam reordering, and the host's search; x bound against the step's own "
                  "bound (which limit it is in brackets); step and graph x the sum of the two limits (moving the "
                  "step's bytes plus doing its FLOPs, one after the other).", "",
                  "| model | batch | beam | rows | backend | ms / step | x step bound | graph | cache write | reorder | search "
                  "| step / graph x sum of limits |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in steps:
            lines.append(f"| {r['model']} | {r['batch']} | {r['beam']} | {r['batch'] * r['beam']} | {r['backend']} | "
                         f"{r['step_ms']:.2f} | {r['step_ratio']:.2f}x ({r['step_bound_kind']}) | {r['graph_ms']:.2f} | "
                         f"{r['write_ms']:.3f} | {r['reorder_ms']:.3f} | {r['search_ms']:.3f} | {sum_ratios(r)} |")
    return "\n".join(lines) + "\n"


def sum_ratios(row: dict) -> str:
    """'step / graph' x the sum of the step's two limits; rows measured before it was recorded: –."""
    if "step_sum_ratio" not in row:
        return "–"
    return f"{row['step_sum_ratio']:.2f}x / {row['graph_sum_ratio']:.2f}x"


def setting_order(key: tuple) -> tuple:
    """Models in the order of the script's list, then by the numbers that follow."""
    model, *numbers = key
    known = ALL_MODELS + EXTRA_MODELS
    return (known.index(model) if model in known else len(known), model, *numbers)


def merged(old: dict, run: dict, rows: list[dict]) -> dict:
    """`old` report plus this run: a new row replaces the old one of the same setting."""
    key = lambda r: (r["model"], r["backend"], r["batch"], r["beam"])  # noqa: E731
    fresh = {key(r) for r in rows}
    kept = [r for r in old.get("rows", []) if key(r) not in fresh]
    return {**run, "runs": [*old.get("runs", [{k: v for k, v in old.items() if k not in ("rows", "runs")}]), run],
            "rows": kept + rows}


def main(argv=None) -> int:
    import json

    import torch

    args = parse_args(argv)
    if args.replot:
        from edgecap.io import write_text_atomic

        out = Path(args.out)
        rows = json.loads((out / "latency.json").read_text())["rows"]
        write_text_atomic(out / "latency.md", markdown(rows))
        pngs = plot(rows, out)
        print(f"wrote {out / 'latency.md'}" + "".join(f", {p}" for p in pngs))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"measuring the hardware limit ({threads} threads) ...", flush=True)
    bandwidth = memory_bandwidth(64 if args.quick else 256, threads=threads)
    flops = matmul_throughput(256 if args.quick else 1024)
    print(f"memory bandwidth {bandwidth / 1e9:.1f} GB/s, fp32 matmul {flops / 1e9:.1f} GFLOP/s", flush=True)
    rows = []
    from edgecap.progress import progress_bar

    with tempfile.TemporaryDirectory(prefix="edgecap-latency-") as tmp:
        workdir = Path(tmp)
        plan = [Setting(m, b, n, k) for m in args.models for n in args.batch_sizes for k in args.beams for b in args.backends]
        bar = progress_bar(total=len(plan), desc="settings", unit="setting")
        for name in args.models:
            model = build_model(name, args)
            mine = [s for s in plan if s.model == name]
            bound = model_bound(model, mine, bandwidth, flops)
            retrieval = None
            if model.encode_extra_names:
                images = min(args.retrieval_images, 500) if args.quick else args.retrieval_images
                retrieval = RetrievalTimer(model.cfg.d_in, images, model.cfg.retrieval.k)
            for s in mine:
                bar.set_postfix_str(f"{s.model} {s.backend} b{s.batch} k{s.beam}")
                rows.append(run_setting(s, model, args, workdir, bound, retrieval))
                bar.update()
        bar.close()
    print()
    print_table(rows, [
        ("status", "status", ""), ("backend", "backend", ""), ("model", "model", ""),
        ("batch", "batch", "d"), ("beam", "beam", "d"), ("ms_per_caption", "ms/caption", ".2f"),
        ("captions_per_s", "captions/s", ".1f"), ("ratio_to_bound", "x bound", ".1f"),
        ("retrieval_ms", "retrieval ms", ".2f"),
    ])
    for r in rows:
        if r["status"] != "ok":
            print(f"skipped {r['backend']} {r['model']} b{r['batch']} k{r['beam']}: {r['reason']}")
    run = {
        "host": host_info(),
        "threads": threads,
        "memory_bandwidth_gb_s": bandwidth / 1e9,
        "matmul_gflop_s": flops / 1e9,
        "forced_full_length": not args.stop_at_eos,
        "args": {k: v for k, v in vars(args).items()},
    }
    for r in rows:
        r.update(memory_bandwidth_gb_s=run["memory_bandwidth_gb_s"], matmul_gflop_s=run["matmul_gflop_s"])
    report = {**run, "runs": [run], "rows": rows}
    if args.append and (out / "latency.json").is_file():
        report = merged(json.loads((out / "latency.json").read_text()), run, rows)
        rows = report["rows"]
    write_json(out / "latency.json", report)
    write_csv(out / "latency.csv", rows)
    from edgecap.io import write_text_atomic

    write_text_atomic(out / "latency.md", markdown(rows))
    pngs = plot(rows, out) if any(r["status"] == "ok" for r in rows) else []
    print(f"\nwrote {out / 'latency.csv'}, {out / 'latency.json'}, {out / 'latency.md'}" + "".join(f", {p}" for p in pngs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
