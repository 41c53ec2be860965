"""GPU check: edgecap's bundles on a GPU against the references, in one run on one card.

For each model (M² at paper size with seeded random weights, the goal model of issue 35; the
trained demo SMArT in edgecap/assets) and each static batch (default 32, 1, 8: the goals' settings
first) it exports an onnxruntime bundle at the largest beam (or takes the ones given with
--bundle) and, for every beam (default 1, 5), captions --inputs seeded batches and times
--repeats more through:
- the CPU provider on the same machine (the fp32 reference for tokens and speed);
- the bundle on the device, three ways: `copy` (the decoding state copied between host and
  device every step, the path before issue 35), `resident` (the state on the device, bound once,
  the cache_update graph writing slots and reordering beams there, the host reading top-k only),
  `resident + CUDA graphs` (the same, each bound run captured once and replayed);
- edgecap's PyTorch decoding on the device (`torch`) and, for M², the official M² code's beam
  search on the device (`m2-official`, benchmarks/_official_m2.py);
and reports per row: tokens identical to the CPU provider (fp16: agreement with the fp32
captions), ms per batch, captions/s, where a step's time goes (step graph, cache update,
copies, reorder, the host's search) and the step against the card's roofline (the step's
bytes and FLOPs, counted on the model, against copy bandwidth and fp32 matmul rate measured in
the same run). Then the goals of issue 35, each met or missed with its numbers.
Results go to OUT/gpu_check.json, OUT/gpu_check.md and OUT/gpu_check.png, rewritten after
every setting.

Without a GPU (no CUDA provider in the installed onnxruntime, or one that cannot start) it prints
one line starting "gpu_check: no GPU" and exits 0 (EXIT_NO_GPU), writing only that reason to
OUT/gpu_check.json. `--device cpu` runs the CPU provider as the "device" (the resident path on
onnxruntime's CPU tensors; torch on the CPU) so every code path runs without a GPU (the tests do).
No new setting starts after --budget seconds. Needs torch, onnx, onnxruntime(-gpu), numpy,
matplotlib and edgecap on PYTHONPATH; no data on disk, no network (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, host_info, save_png, timed, write_json  # noqa: E402
from _gpu_runs import BundleRun, OfficialRun, TorchRun, peak_rates  # noqa: E402

from edgecap.argtypes import BATCH, BEAM, COUNT, Integer, ListOf, Parser  # noqa: E402

EXIT_NO_GPU = 0  # documented: no GPU is not a failure of the check (CI runs it on CPU machines)
DEMO = REPO / "edgecap" / "assets" / "demo-smart.pt"
MODELS = ("m2", "demo")
PRECISIONS = ("fp32", "tf32", "fp16")  # tf32: the fp32 bundle with the CUDA provider's TF32 matmuls on
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
CPU_PROVIDER, TORCH, OFFICIAL = "CPU provider", "torch", "m2-official"
# the bundle on the device: name -> Bundle.load(device_state=..., cuda_graph=...)
PATHS = {"copy": (False, False), "resident": (True, False), "resident + CUDA graphs": (True, True)}
RESIDENT = ("resident", "resident + CUDA graphs")


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for gpu_check.json / .md / .png")
    p.add_argument("--workdir", help="keep the exported bundles here (default: a temporary folder, removed at the end)")
    p.add_argument("--bundle", action="append", default=[],
                   help="run this exported onnxruntime bundle instead of exporting (repeatable)")
    p.add_argument("--models", default=",".join(MODELS), help=f"models to export: {', '.join(MODELS)}")
    p.add_argument("--batches", type=ListOf(BATCH), default=[32, 1, 8],
                   help="static batches to export, in this order (default 32,1,8)")
    p.add_argument("--beams", type=ListOf(BEAM), default=[1, 5], help="beam sizes to run (default 1,5)")
    p.add_argument("--precisions", default="fp32,fp16", help=f"device precisions: {', '.join(PRECISIONS)} (default fp32,fp16)")
    p.add_argument("--inputs", type=COUNT, default=3, help="batches of seeded inputs compared token by token")
    p.add_argument("--repeats", type=COUNT, default=20, help="timed captions per setting on the device")
    p.add_argument("--cpu-repeats", type=COUNT, default=3, help="timed captions per setting on the CPU provider")
    p.add_argument("--ref-repeats", type=COUNT, default=5, help="timed captions per setting of the PyTorch references")
    p.add_argument("--warmup", type=Integer(0), default=3)
    p.add_argument("--budget", type=Integer(10), default=420,
                   help="seconds after which no new setting starts (the rest is reported as skipped)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: the CPU provider stands in for the GPU (tests the check without one)")
    p.add_argument("--quick", action="store_true", help="M² at a tiny size instead of paper size (tests)")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.precisions = [x.strip() for x in args.precisions.split(",") if x.strip()]
    for name, given, allowed in (("--models", args.models, MODELS), ("--precisions", args.precisions, PRECISIONS)):
        for value in given:
            if value not in allowed:
                p.error(f"{name}: unknown {value!r}; choose from {', '.join(allowed)}")
    return args


# -- the device ----------------------------------------------------------------------------------
def no_gpu_reason() -> str | None:
    """Why the CUDA provider cannot run here, or None when it can (a one-node graph is run)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    available = ort.get_available_providers()
    if CUDA not in available:
        return (f"onnxruntime {ort.__version__} has no {CUDA} (providers: {', '.join(available)}); "
                f"install onnxruntime-gpu (docs/gpu.md)")
    load_cuda_libraries(ort)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=[CUDA, CPU])
        session.run(None, {"x": np.ones(2, np.float32)})
    except Exception as exc:  # onnxruntime raises its own exception types
        return f"{CUDA} is installed but does not start: {str(exc).strip().splitlines()[0][:200]}"
    if CUDA not in session.get_providers():
        return f"{CUDA} is installed but did not start (no usable NVIDIA driver or CUDA libraries?)"
    return None


def load_cuda_libraries(ort) -> None:
    """Make the CUDA and cuDNN libraries of the pip packages a CUDA torch brings (nvidia-*)
    visible to onnxruntime-gpu, so no system CUDA install is needed: importing torch loads them,
    and onnxruntime >= 1.21 can preload them itself."""
    try:
        import torch  # noqa: F401  (loads libcudart, cuBLAS, cuDNN from its nvidia-* packages)
    except ImportError:
        pass
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:  # noqa: BLE001 (best effort: the probe session says what is missing)
            pass


def gpu_info() -> dict:
    """The GPU's name, driver and memory: nvidia-smi where it exists, else torch.cuda."""
    if shutil.which("nvidia-smi"):
        fields = ("name", "driver_version", "memory.total", "memory.used")
        try:
            out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
            values = [v.strip() for v in out.splitlines()[0].split(",")]
            info = dict(zip(fields, values, strict=True))
            return {"name": info["name"], "driver": info["driver_version"], "memory_total_mib": float(info["memory.total"]),
                    "memory_used_mib": float(info["memory.used"]), "source": "nvidia-smi"}
        except (subprocess.SubprocessError, OSError, IndexError, ValueError):
            pass
    try:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info(0)
            return {"name": torch.cuda.get_device_name(0), "driver": None, "memory_total_mib": total / 2**20,
                    "memory_used_mib": (total - free) / 2**20, "source": "torch.cuda"}
    except ImportError:
        pass
    return {"name": None, "source": "none (no nvidia-smi, no CUDA torch)"}


@dataclass(frozen=True)
class Device:
    name: str  # "cuda" or "cpu"

    def providers(self, precision: str) -> list:
        if self.name == "cpu":
            return [CPU]
        # TF32 rounds fp32 matmul inputs to 10 mantissa bits: off for the fp32 parity run
        return [(CUDA, {"use_tf32": "1" if precision == "tf32" else "0"}), CPU]


# -- bundles -------------------------------------------------------------------------------------
def m2_checkpoint(workdir: Path, quick: bool) -> Path:
    """M² at paper size (the zoo's m2 preset: d 512, 3 + 3 layers, 40 memory slots, 50 regions of
    2048, vocabulary 10000) with seeded random weights, saved as a checkpoint."""
    import torch

    from edgecap.contract.vocab import Vocab
    from edgecap.models import build
    from edgecap.models.checkpoint import save_checkpoint

    path = workdir / ("m2-quick.pt" if quick else "m2-paper.pt")
    if path.exists():
        return path
    torch.manual_seed(0)
    small = {"d_model": 64, "n_heads": 4, "d_ff": 128, "d_in": 64, "n_regions": 10, "vocab_size": 200, "max_len": 8}
    model = build("m2", dropout=0.0, **(small if quick else {})).eval()
    vocab = Vocab(["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(model.cfg.vocab_size - 4)])
    return save_checkpoint(path, model, vocab)


def export(checkpoint: Path, out: Path, batch: int, beam: int, precision: str) -> Path:
    """An onnxruntime bundle (one parity sample: the export's own fp32 gate still runs)."""
    from edgecap.export.bundle import export_bundle
    from edgecap.export.formats import resolve_settings

    if not (out / "manifest.json").exists():
        settings = resolve_settings({"engine": "onnx", "batch": batch, "beam": beam, "precision": precision,
                                     "samples": 1, "out": str(out), "force": True})
        export_bundle(checkpoint, settings, progress=False)
    return out


def export_trt(checkpoint: Path, out: Path, batch: int, beam: int, precision: str) -> Path:
    from edgecap.export.bundle import export_bundle
    from edgecap.export.formats import resolve_settings

    settings = resolve_settings({"engine": "trt", "batch": batch, "beam": beam, "precision": precision,
                                 "samples": 1, "out": str(out), "force": True})
    export_bundle(checkpoint, settings, progress=False)
    return out


def model_inputs(manifest, count: int) -> list[tuple]:
    """`count` seeded batches of what the bundle's first graph takes: images normalised as its
    preprocessing says (uniform pixels), or features with a full mask."""
    import numpy as np

    rng = np.random.default_rng(0)
    first = manifest.graph("visual") or manifest.graph("encoder")
    out = []
    for _ in range(count):
        batch = []
        for spec in first.inputs:
            if spec.dtype == "bool":
                batch.append(np.ones(spec.shape, dtype=bool))
            elif spec.dtype.startswith("int"):
                batch.append(rng.integers(4, manifest.model.config["vocab_size"], spec.shape).astype(spec.dtype))
            elif manifest.input == "images":
                pre = manifest.preprocessing
                pixels = rng.random(spec.shape, dtype=np.float32)
                mean = np.asarray(pre.mean, np.float32).reshape(1, -1, 1, 1)
                std = np.asarray(pre.std, np.float32).reshape(1, -1, 1, 1)
                batch.append(((pixels - mean) / std).astype(np.float32))
            else:
                batch.append(rng.standard_normal(spec.shape, dtype=np.float32))
        out.append(tuple(batch))
    return out


def median_ms(seconds: list[float]) -> float:
    return 1e3 * statistics.median(seconds)


# -- one run -------------------------------------------------------------------------------------
@dataclass
class Run:
    """What the settings of one run share: the device, its measured rates, the CPU provider's
    captions (the reference every row is compared with) and the models' step costs."""

    args: object
    device: Device
    workdir: Path
    rates: dict
    reference: dict = field(default_factory=dict)  # (model, batch, beam) -> CPU provider captions of the inputs
    costs: dict = field(default_factory=dict)      # (model, batch, beam) -> the step's bytes and FLOPs

    def step_bound_ms(self, label: str, checkpoint: Path | None, batch: int, beam: int) -> float | None:
        """The step's roofline on this device: max(bytes / bandwidth, FLOPs / rate)."""
        if checkpoint is None:
            return None
        key = (label, batch, beam)
        if key not in self.costs:
            from _roofline import step_cost

            from edgecap.models.checkpoint import load_checkpoint

            self.costs[key] = step_cost(load_checkpoint(checkpoint).model.eval(), batch, beam)
        cost = self.costs[key]
        moved = cost["weight_bytes"] + cost["cache_bytes"] + cost["cross_bytes"]
        return 1e3 * max(moved / self.rates["bandwidth"], cost["flops"] / self.rates["flops"])


def row(label, precision, batch, beam, path, engine, runner_s, captions, reference) -> dict:
    same = sum(a == b for a, b in zip(captions, reference, strict=True))
    ms = median_ms(runner_s)
    return {"model": label, "precision": precision, "batch": batch, "beam": beam, "path": path, "engine": engine,
            "identical": same / len(reference), "captions_compared": len(reference), "ms": ms,
            "ms_per_caption": ms / batch, "captions_per_s": 1e3 * batch / ms}


def captions_of(runner, inputs: list[tuple], beam: int) -> list[tuple[int, ...]]:
    return [seq for batch in inputs for seq in runner.caption(batch, beam)]


def timed_row(run: Run, runner: BundleRun, label: str, precision: str, beam: int, path: str, engine: str,
              inputs, reference, checkpoint: Path | None, repeats: int, warmup: int) -> dict:
    """One bundle row: tokens against `reference` over every input batch, the median of
    `repeats` timed captions, then where a step's time goes (a few more captions, their parts
    timed) and the step against the device's roofline."""
    batch = runner.bundle.batch_size
    captions = captions_of(runner, inputs, beam)
    seconds = timed(lambda: runner.caption(inputs[0], beam), repeats, warmup)
    r = row(label, precision, batch, beam, path, engine, seconds, captions, reference or captions)
    runner.reset_timing()
    timed(lambda: runner.caption(inputs[0], beam), min(repeats, 5), 0)
    r.update(runner.where_time_goes())
    bound = run.step_bound_ms(label, checkpoint, batch, beam)
    if bound:
        r.update(step_bound_ms=bound, x_step_bound=r["step_ms"] / bound)
    return r


def reference_captions(run: Run, label: str, fp32_bundle: Path, inputs, checkpoint: Path | None) -> list[dict]:
    """The CPU provider on the fp32 bundle: its captions become the reference of (label, batch,
    beam) for every later row; each beam's run timed into a row, once."""
    from edgecap.runtime.session import Bundle

    rows, cpu = [], None
    for beam in run.args.beams:
        if cpu is None:
            cpu = BundleRun(Bundle.load(fp32_bundle, providers=[CPU], engine="onnxruntime"))
        key = (label, cpu.bundle.batch_size, beam)
        if beam > cpu.bundle.beam_size or key in run.reference:
            continue
        r = timed_row(run, cpu, label, "fp32", beam, CPU_PROVIDER, "onnxruntime", inputs, None, checkpoint,
                      run.args.cpu_repeats, 1)
        run.reference[key] = captions_of(cpu, inputs, beam)
        rows.append(r)
    return rows


def bundle_rows(run: Run, label: str, path: Path, precision: str, inputs, checkpoint: Path | None,
                engine: str = "onnxruntime") -> list[dict]:
    """The bundle at `path` on the device, each way it can hold its decoding state."""
    from edgecap.runtime.session import Bundle

    args, device = run.args, run.device
    paths = PATHS if device.name == "cuda" else {"resident": PATHS["resident"]}
    rows = []
    for name, (device_state, cuda_graph) in paths.items():
        if engine == "tensorrt" and not device_state:
            continue
        try:
            if engine == "tensorrt":
                bundle = Bundle.load(path, engine="tensorrt", device_state=True, cuda_graph=cuda_graph)
            else:
                bundle = Bundle.load(path, providers=device.providers(precision), engine="onnxruntime",
                                     device_state=device_state, cuda_graph=cuda_graph)
        except Exception as exc:  # noqa: BLE001 (e.g. a graph CUDA graphs cannot capture: reported, the rest run)
            rows.append({"model": label, "precision": precision, "path": name, "engine": engine,
                         "error": f"{type(exc).__name__}: {first_line(exc)}"})
            continue
        runner = BundleRun(bundle)
        for beam in [b for b in args.beams if b <= bundle.beam_size]:
            repeats = min(args.repeats, 5) if name == "copy" else args.repeats  # the old path: a comparison only
            r = timed_row(run, runner, label, precision, beam, name, engine, inputs,
                          run.reference[(label, bundle.batch_size, beam)], checkpoint, repeats, args.warmup)
            r["providers"] = bundle.providers if engine == "onnxruntime" else ["TensorRT"]
            rows.append(r)
        del runner, bundle
    if device.name == "cuda" and rows:  # the whole GPU's, this bundle's sessions open
        rows[-1]["gpu_memory_used_mib"] = gpu_info().get("memory_used_mib")
    return rows


def reference_rows(run: Run, label: str, checkpoint: Path, batch: int, inputs) -> list[dict]:
    """edgecap's PyTorch decoding and, for M², the official code's, on the device (fp32, TF32 off)."""
    import torch
    from _official_m2 import supports

    from edgecap.models.checkpoint import load_checkpoint

    args, device = run.args, run.device
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = load_checkpoint(checkpoint).model
    runners = {TORCH: TorchRun(model, device.name, model.cfg.max_len)}
    if supports(model.cfg) is None:
        runners[OFFICIAL] = OfficialRun(model, device.name, model.cfg.max_len)
    rows = []
    for name, runner in runners.items():
        for beam in args.beams:
            reference = run.reference.get((label, batch, beam))
            if reference is None:
                continue
            captions = captions_of(runner, inputs, beam)
            seconds = timed(lambda b=beam, r=runner: r.caption(inputs[0], b), args.ref_repeats, 1)
            rows.append(row(label, "fp32", batch, beam, name, "torch", seconds, captions, reference))
    del runners, model
    if device.name == "cuda":
        torch.cuda.empty_cache()
    return rows


@dataclass
class Job:
    label: str
    checkpoint: Path | None
    batch: int
    precision: str
    bundle: Path | None = None  # given with --bundle


def jobs(args, workdir: Path) -> list[Job]:
    if args.bundle:
        from edgecap.contract.manifest import load_manifest

        out = []
        for given in args.bundle:
            m = load_manifest(Path(given))
            precision = {g.precision for g in m.graphs} - {"fp32"}
            out.append(Job(Path(given).name, None, m.batch_size, precision.pop() if precision else "fp32", Path(given)))
        return out
    checkpoints = {"demo": DEMO, "m2": None}  # M²'s is made when its first job runs: inside the time budget
    order = [p for p in PRECISIONS if p in args.precisions]
    # a model's settings together, fp32 first: M²'s goals (and its fp16 agreement) before the demo's
    return [Job(model, checkpoints[model], batch, precision)
            for model in args.models for precision in order for batch in args.batches]


def run_job(job: Job, run: Run) -> list[dict]:
    from edgecap.runtime.session import Bundle

    args = run.args
    beam = max(args.beams)
    if job.bundle is not None:
        inputs = model_inputs(Bundle.load(job.bundle, providers=[CPU]).manifest, args.inputs)
        rows = reference_captions(run, job.label, job.bundle, inputs, None)
        return rows + bundle_rows(run, job.label, job.bundle, job.precision, inputs, None)
    checkpoint = job.checkpoint or m2_checkpoint(run.workdir, args.quick)
    fp32 = export(checkpoint, run.workdir / f"{job.label}-fp32-b{job.batch}k{beam}", job.batch, beam, "fp32")
    inputs = model_inputs(Bundle.load(fp32, providers=[CPU]).manifest, args.inputs)
    rows = reference_captions(run, job.label, fp32, inputs, checkpoint)
    if job.precision in ("fp32", "tf32"):
        rows += bundle_rows(run, job.label, fp32, job.precision, inputs, checkpoint)
        if job.precision == "fp32":
            rows += reference_rows(run, job.label, checkpoint, job.batch, inputs)
        return rows
    fp16 = export(checkpoint, run.workdir / f"{job.label}-fp16-b{job.batch}k{beam}", job.batch, beam, "fp16")
    return rows + bundle_rows(run, job.label, fp16, "fp16", inputs, checkpoint)


def run_tensorrt(run: Run, deadline: float) -> tuple[list[dict], str]:
    """The demo at the first batch through TensorRT engines, when `tensorrt` imports."""
    import importlib.util

    from edgecap.runtime.session import Bundle

    args = run.args
    if run.device.name != "cuda":
        return [], "not run (--device cpu)"
    if importlib.util.find_spec("tensorrt") is None:
        return [], "not run: tensorrt is not installed (pip install \"tensorrt>=10,<12\"; docs/gpu.md)"
    if time.monotonic() > deadline:
        return [], "not run: time budget spent"
    beam, batch = max(args.beams), args.batches[0]
    rows = []
    try:
        for precision in ("fp32", "fp16"):
            out = export_trt(DEMO, run.workdir / f"demo-trt-{precision}-b{batch}k{beam}", batch, beam, precision)
            inputs = model_inputs(Bundle.load(out, providers=[CPU], engine="onnxruntime").manifest, args.inputs)
            reference = run.workdir / f"demo-fp32-b{batch}k{beam}"
            rows += reference_captions(run, "demo", export(DEMO, reference, batch, beam, "fp32"), inputs, DEMO)
            rows += bundle_rows(run, "demo", out, precision, inputs, DEMO, engine="tensorrt")
    except Exception as exc:  # noqa: BLE001 (as in check(): reported, not fatal)
        return rows, f"failed: {type(exc).__name__}: {first_line(exc)}"
    return rows, "ran"


# -- the goals of issue 35 -----------------------------------------------------------------------
def cell(rows: list[dict], **where) -> dict | None:
    """The fastest row matching `where` (path may be a tuple of paths)."""
    paths = where.pop("path", None)
    found = [r for r in rows if "ms" in r and all(r.get(k) == v for k, v in where.items())
             and (paths is None or r["path"] in (paths if isinstance(paths, tuple) else (paths,)))]
    return min(found, key=lambda r: r["ms"]) if found else None


def goals(report: dict) -> list[dict]:
    """Each goal of issue 35 (M², fp32 unless said) with what this run measured: met, missed,
    or not measured (and why)."""
    rows, out = report["rows"], []
    scale = "" if report["settings"].get("quick") is False else " (tiny M²: --quick)"
    on = "" if report["device"] == "cuda" else " (CPU provider as the device: not a GPU measurement)"

    def add(goal, met, measured, missing):
        status = "not measured" if met is None else "met" if met else "missed"
        out.append({"goal": goal, "status": status, "measured": measured if met is not None else missing})

    best = cell(rows, model="m2", precision="fp32", batch=32, beam=5, path=RESIDENT)
    official = cell(rows, model="m2", batch=32, beam=5, path=OFFICIAL)
    cpu = cell(rows, model="m2", batch=32, beam=5, path=CPU_PROVIDER)
    for goal, ref, need in (("batch 32, beam 5: >= 5x faster than the official M² code on the same GPU", official, 5.0),
                            ("batch 32, beam 5: >= 10x faster than the same machine's CPU provider", cpu, 10.0)):
        if best and ref:
            ratio = ref["ms"] / best["ms"]
            add(goal, ratio >= need, f"{ratio:.1f}x ({best['path']} {best['ms']:.1f} ms vs {ref['ms']:.1f} ms){scale}{on}", "")
        else:
            add(goal, None, "", "batch 32, beam 5 not run")
    one = cell(rows, model="m2", precision="fp32", batch=1, beam=5, path=RESIDENT)
    add("batch 1, beam 5: <= 15 ms per caption", one and one["ms_per_caption"] <= 15.0 if one else None,
        f"{one['ms_per_caption']:.1f} ms ({one['path']}){scale}{on}" if one else "", "batch 1, beam 5 not run")
    fp32 = [r for r in rows if "ms" in r and r["precision"] == "fp32" and r["engine"] != "torch"]
    differ = [r for r in fp32 if r["identical"] < 1.0]
    add("fp32 tokens identical to the CPU provider", not differ if fp32 else None,
        f"{len(fp32) - len(differ)} of {len(fp32)} settings identical"
        + "".join(f"; {r['model']} b{r['batch']} k{r['beam']} {r['path']}: {r['identical']:.0%}" for r in differ),
        "no fp32 setting ran")
    fp16 = [r for r in rows if "ms" in r and r["precision"] == "fp16"]
    worst = min(fp16, key=lambda r: r["identical"]) if fp16 else None
    add("fp16 captions >= 95% identical to fp32", worst["identical"] >= 0.95 if worst else None,
        f"worst {worst['identical']:.0%} ({worst['model']} b{worst['batch']} k{worst['beam']} {worst['path']})"
        if worst else "", "no fp16 setting ran")
    add("CPU provider latency no worse than before", None, "", "measured with benchmarks/latency.py, before and after")
    return out


# -- outputs -------------------------------------------------------------------------------------
def ratio(a: dict | None, b: dict) -> str:
    return f"{a['ms'] / b['ms']:.1f}x" if a else "–"


def markdown(report: dict) -> str:
    gpu, rates = report["gpu"], report.get("rates") or {}
    memory = f"{gpu['memory_total_mib']:.0f} MiB" if gpu.get("memory_total_mib") else "?"
    rows = [r for r in report["rows"] if "ms" in r]
    lines = [f"GPU: {gpu.get('name') or '?'} ({memory}, driver {gpu.get('driver') or '?'}); "
             f"onnxruntime {report['onnxruntime']}; device `{report['device']}`; CPU: {report['host']['cpu']} "
             f"x {report['host']['logical_cores']}"]
    if rates:
        lines.append(f"Measured roofline ({rates['source']}): {rates['bandwidth'] / 1e9:.0f} GB/s copy, "
                     f"{rates['flops'] / 1e12:.2f} TFLOP/s fp32 matmul")
    lines += ["", "| model | precision | batch | beam | path | tokens = CPU (fp16: = fp32) | ms / batch | captions/s "
              "| vs CPU provider | vs m2-official | vs torch |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        same = dict(model=r["model"], batch=r["batch"], beam=r["beam"])
        lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | {r['beam']} | {r['path']} | "
                     f"{r['identical']:.0%} of {r['captions_compared']} | {r['ms']:.2f} | {r['captions_per_s']:.0f} | "
                     f"{ratio(cell(rows, **same, path=CPU_PROVIDER), r)} | {ratio(cell(rows, **same, path=OFFICIAL), r)} | "
                     f"{ratio(cell(rows, **same, path=TORCH), r)} |")
    parts = [r for r in rows if r.get("per_step_ms")]
    if parts:
        names = list(dict.fromkeys(k for r in parts for k in r["per_step_ms"]))
        lines += ["", "Where a step's time goes (ms per step, mean over timed decodes; `copy` and the CPU provider "
                  "count their copies in the step graph), and the step against the card's roofline:", "",
                  "| model | precision | batch | beam | path | " + " | ".join(names) + " | step | bound | x bound |",
                  "|---" * (len(names) + 8) + "|"]
        for r in parts:
            values = " | ".join(f"{r['per_step_ms'].get(n, 0.0):.3f}" for n in names)
            bound = f"{r['step_bound_ms']:.3f} | {r['x_step_bound']:.1f}x" if r.get("step_bound_ms") else "– | –"
            lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | {r['beam']} | {r['path']} | {values} | "
                         f"{r['step_ms']:.3f} | {bound} |")
    lines += ["", "| goal (issue 35) | status | measured |", "|---|---|---|"]
    lines += [f"| {g['goal']} | {g['status']} | {g['measured']} |" for g in report.get("goals", [])]
    lines += ["", f"TensorRT: {report['tensorrt']}"]
    lines += [f"failed: {r['model']} {r['precision']} {r['path']}: {r['error']}" for r in report["rows"] if "error" in r]
    lines += [f"skipped: {s}" for s in report["skipped"]]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> Path | None:
    """Per model, at its largest beam: ms per batch against the batch, one line per path (top);
    where a step's time goes, one stacked bar per path and batch (bottom)."""
    rows = [r for r in rows if "ms" in r]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 8), squeeze=False)
    for col, model in enumerate(models):
        top, bottom = axes[0][col], axes[1][col]
        beam = max(r["beam"] for r in rows if r["model"] == model)
        mine = [r for r in rows if r["model"] == model and r["beam"] == beam]
        series: dict[tuple, list] = {}
        for r in mine:
            series.setdefault((r["path"], r["precision"]), []).append((r["batch"], r["ms"]))
        for (name, precision), points in sorted(series.items()):
            points.sort()
            style = "--" if name in (CPU_PROVIDER, TORCH, OFFICIAL) else "-"
            top.plot([b for b, _ in points], [ms for _, ms in points], style, marker="o", label=f"{name} {precision}")
        top.set_xscale("log", base=2)
        top.set_yscale("log")
        top.set_xlabel("batch (images)")
        top.set_ylabel("ms per batch (median)")
        top.set_title(f"{model}, beam {beam}")
        top.legend(fontsize=7)
        parted = sorted((r for r in mine if r.get("per_step_ms")), key=lambda r: (r["batch"], r["precision"], r["path"]))
        names = list(dict.fromkeys(k for r in parted for k in r["per_step_ms"]))
        base = [0.0] * len(parted)
        for name in names:
            values = [max(0.0, r["per_step_ms"].get(name, 0.0)) for r in parted]
            bottom.bar(range(len(parted)), values, bottom=base, label=name)
            base = [a + b for a, b in zip(base, values, strict=True)]
        bottom.set_xticks(range(len(parted)), [f"{r['path']}\n{r['precision']} b{r['batch']}" for r in parted],
                          rotation=90, fontsize=6)
        bottom.set_yscale("log" if parted and max(base) > 20 * max(min(base), 1e-9) else "linear")
        bottom.set_ylabel("ms per step")
        bottom.set_title(f"{model}, beam {beam}: where a step's time goes")
        bottom.legend(fontsize=7)
    return save_png(fig, path)


def write_outputs(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report["goals"] = goals(report)
    write_json(out / "gpu_check.json", report)
    from edgecap.io import write_text_atomic

    write_text_atomic(out / "gpu_check.md", markdown(report))
    plot(report["rows"], out / "gpu_check.png")


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    out = Path(args.out)
    import onnxruntime as ort

    device = Device(args.device)
    if device.name == "cpu":  # TF32 is a GPU math mode: on the CPU provider it is the fp32 run again
        args.precisions = [p for p in args.precisions if p != "tf32"]
    if device.name == "cuda":
        reason = no_gpu_reason()
        if reason:
            print(f"gpu_check: no GPU: {reason}; nothing measured", flush=True)
            out.mkdir(parents=True, exist_ok=True)
            write_json(out / "gpu_check.json", {"skipped": reason, "onnxruntime": ort.__version__})
            return EXIT_NO_GPU
    with contextlib.ExitStack() as stack:
        if args.workdir:
            workdir = Path(args.workdir)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edgecap-gpu-check-")))
        return check(args, device, out, workdir, start)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def check(args, device: Device, out: Path, workdir: Path, start: float) -> int:
    import onnxruntime as ort

    from edgecap.progress import progress_bar

    deadline = start + args.budget
    run = Run(args, device, workdir, peak_rates(device.name))
    report = {
        "device": device.name, "gpu": gpu_info() if device.name == "cuda" else {"name": "CPU provider as the device"},
        "onnxruntime": ort.__version__, "host": host_info(), "rates": run.rates, "rows": [], "tensorrt": "not run yet",
        "skipped": [], "seconds": 0.0, "settings": {k: v for k, v in vars(args).items() if k not in ("out", "workdir")},
    }
    for job in progress_bar(jobs(args, workdir), desc="gpu_check", unit="setting"):
        name = f"{job.label} {job.precision} batch {job.batch}"
        if time.monotonic() > deadline:
            report["skipped"].append(f"{name}: time budget ({args.budget} s) spent")
            continue
        try:
            report["rows"] += run_job(job, run)
        except Exception as exc:  # noqa: BLE001 (one run on a lent machine: a failing setting is reported, the rest still run)
            report["skipped"].append(f"{name}: {type(exc).__name__}: {first_line(exc)}")
        report["seconds"] = time.monotonic() - start
        write_outputs(report, out)  # what is measured so far survives a kill
        print(f"gpu_check: {name} done at {report['seconds']:.0f} s", file=sys.stderr, flush=True)
    trt_rows, report["tensorrt"] = run_tensorrt(run, deadline)
    report["rows"] += trt_rows
    report["seconds"] = time.monotonic() - start
    write_outputs(report, out)
    print(markdown(report))
    fp32 = [r for r in report["rows"] if "ms" in r and r["precision"] == "fp32" and r["engine"] != "torch"]
    mismatched = [r for r in fp32 if r["identical"] < 1.0]
    verdict = "fp32 tokens identical to the CPU provider" if fp32 and not mismatched else (
        f"fp32 tokens differ from the CPU provider in {len(mismatched)} of {len(fp32)} settings" if fp32
        else "no fp32 setting ran")
    print(f"gpu_check: {verdict}; {len(report['rows'])} rows in {report['seconds']:.0f} s; results in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
