"""GPU check: edgecap's bundles on onnxruntime's CUDA provider (and TensorRT when it imports).

For each model (the trained demo SMArT in edgecap/assets, and M² at paper size with seeded
random weights) and each batch it exports an onnxruntime bundle (or takes the ones given with
--bundle), runs it on the CPU provider as the reference and on the device, and reports:
- parity: the best beam of every image, token for token, device against CPU on the same bundle
  (fp32 with TF32 off must be identical; TF32 and fp16 say how close they come);
- latency: median caption time (front end + encoder + beam search, as `Bundle` runs them) after
  warm-up, for every batch x beam, beside the CPU provider's;
- the GPU's name, driver and memory (nvidia-smi, else torch.cuda).
Results go to OUT/gpu_check.json, OUT/gpu_check.md and OUT/gpu_check.png.

Without a GPU (no CUDA provider in the installed onnxruntime, or one that cannot start) it prints
one line starting "gpu_check: no GPU" and exits 0 (EXIT_NO_GPU), writing only that reason to
OUT/gpu_check.json. `--device cpu` runs the CPU provider as the "device" so the parity and timing
code is exercised without a GPU (the tests do). It stops starting new work after --budget seconds
so the whole check ends within 5 minutes. Needs torch, onnx, onnxruntime(-gpu), numpy,
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, host_info, save_png, timed, write_json  # noqa: E402

from edgecap.argtypes import BATCH, BEAM, COUNT, Integer, ListOf, Parser  # noqa: E402

EXIT_NO_GPU = 0  # documented: no GPU is not a failure of the check (CI runs it on CPU machines)
DEMO = REPO / "edgecap" / "assets" / "demo-smart.pt"
MODELS = ("demo", "m2")
PRECISIONS = ("fp32", "tf32", "fp16")  # tf32: the fp32 bundle with the CUDA provider's TF32 matmuls on
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for gpu_check.json / .md / .png")
    p.add_argument("--workdir", help="keep the exported bundles here (default: a temporary folder, removed at the end)")
    p.add_argument("--bundle", action="append", default=[],
                   help="run this exported onnxruntime bundle instead of exporting (repeatable)")
    p.add_argument("--models", default=",".join(MODELS), help=f"models to export: {', '.join(MODELS)}")
    p.add_argument("--batches", type=ListOf(BATCH), default=[1, 8], help="static batches to export (default 1,8)")
    p.add_argument("--beams", type=ListOf(BEAM), default=[1, 3], help="beam sizes to run (default 1,3)")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help=f"device precisions: {', '.join(PRECISIONS)}")
    p.add_argument("--inputs", type=COUNT, default=3, help="batches of seeded inputs compared token by token")
    p.add_argument("--repeats", type=COUNT, default=20, help="timed captions per setting on the device")
    p.add_argument("--cpu-repeats", type=COUNT, default=3, help="timed captions per setting on the CPU provider")
    p.add_argument("--warmup", type=Integer(0), default=3)
    p.add_argument("--budget", type=Integer(10), default=200,
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


def caption(bundle, inputs: tuple, beam: int):
    from edgecap.contract.beam import DecodeOptions

    if bundle.has_visual:
        feats, mask = bundle.visual(inputs[0])
        extra = inputs[1:]
    else:
        feats, mask, extra = inputs[0], inputs[1], inputs[2:]
    return bundle.decode(bundle.encode(feats, mask, *extra), DecodeOptions(beam_size=beam, max_len=bundle.max_len))


def best_sequences(hyp) -> list[tuple[int, ...]]:
    import numpy as np

    tokens, lengths = np.asarray(hyp.tokens)[:, 0], np.asarray(hyp.lengths)[:, 0]
    return [tuple(int(t) for t in row[: int(n)]) for row, n in zip(tokens, lengths, strict=True)]


def median_ms(seconds: list[float]) -> float:
    return 1e3 * statistics.median(seconds)


# -- one bundle ----------------------------------------------------------------------------------
def check_bundle(label: str, path: Path, device: Device, precision: str, args, engine: str = "onnxruntime") -> list[dict]:
    """Rows (one per beam) for the bundle at `path` on the device, its tokens compared with the
    CPU provider's on the same bundle's ONNX graphs."""
    from edgecap.runtime.session import Bundle

    cpu = Bundle.load(path, providers=[CPU], engine="onnxruntime")
    if engine == "tensorrt":
        dev = Bundle.load(path, engine="tensorrt")
    else:
        dev = Bundle.load(path, providers=device.providers(precision), engine="onnxruntime")
    inputs = model_inputs(dev.manifest, args.inputs)
    rows = []
    for beam in args.beams:
        if beam > dev.beam_size:
            continue
        cpu_seqs, dev_seqs = [], []
        for batch in inputs:
            cpu_seqs += best_sequences(caption(cpu, batch, beam))
            dev_seqs += best_sequences(caption(dev, batch, beam))
        same = sum(a == b for a, b in zip(cpu_seqs, dev_seqs, strict=True))
        dev_s = timed(lambda b=beam: caption(dev, inputs[0], b), args.repeats, args.warmup)
        cpu_s = timed(lambda b=beam: caption(cpu, inputs[0], b), args.cpu_repeats, 1)
        rows.append({
            "model": label, "engine": engine, "precision": precision, "batch": dev.batch_size, "beam": beam,
            "providers": dev.providers if engine == "onnxruntime" else ["TensorRT"],
            "identical": same / len(cpu_seqs), "captions_compared": len(cpu_seqs),
            "device_ms": median_ms(dev_s), "cpu_ms": median_ms(cpu_s),
            "device_captions_per_s": dev.batch_size / statistics.median(dev_s),
            "speedup": statistics.median(cpu_s) / statistics.median(dev_s),
            "bundle": str(path),
        })
    if device.name == "cuda" and rows:  # the whole GPU's, this bundle's sessions open
        rows[-1]["gpu_memory_used_mib"] = gpu_info().get("memory_used_mib")
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
    checkpoints = {"demo": DEMO}
    if "m2" in args.models:
        checkpoints["m2"] = None  # made when its first job runs: inside the time budget
    order = [p for p in ("fp32", "tf32", "fp16") if p in args.precisions]
    return [Job(model, checkpoints[model], batch, precision)
            for precision in order for model in args.models for batch in args.batches]


def run_job(job: Job, device: Device, args, workdir: Path) -> list[dict]:
    beam = max(args.beams)
    if job.bundle is not None:
        return check_bundle(job.label, job.bundle, device, job.precision, args)
    checkpoint = job.checkpoint or m2_checkpoint(workdir, args.quick)
    fp32 = export(checkpoint, workdir / f"{job.label}-fp32-b{job.batch}k{beam}", job.batch, beam, "fp32")
    if job.precision in ("fp32", "tf32"):
        return check_bundle(job.label, fp32, device, job.precision, args)
    fp16 = export(checkpoint, workdir / f"{job.label}-fp16-b{job.batch}k{beam}", job.batch, beam, "fp16")
    return check_bundle(job.label, fp16, device, "fp16", args)


def run_tensorrt(args, device: Device, workdir: Path, deadline: float) -> tuple[list[dict], str]:
    """The demo at the first batch through TensorRT engines, when `tensorrt` imports."""
    import importlib.util

    if device.name != "cuda":
        return [], "not run (--device cpu)"
    if importlib.util.find_spec("tensorrt") is None:
        return [], "not run: tensorrt is not installed (pip install \"tensorrt>=10,<12\"; docs/gpu.md)"
    if time.monotonic() > deadline:
        return [], "not run: time budget spent"
    beam, batch = max(args.beams), args.batches[0]
    rows = []
    try:
        for precision in ("fp32", "fp16"):
            out = export_trt(DEMO, workdir / f"demo-trt-{precision}-b{batch}k{beam}", batch, beam, precision)
            rows += check_bundle("demo", out, device, precision, args, engine="tensorrt")
    except Exception as exc:  # noqa: BLE001 (as in check(): reported, not fatal)
        return rows, f"failed: {type(exc).__name__}: {first_line(exc)}"
    return rows, "ran"


# -- outputs -------------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    gpu = report["gpu"]
    memory = f"{gpu['memory_total_mib']:.0f} MiB" if gpu.get("memory_total_mib") else "?"
    lines = [f"GPU: {gpu.get('name') or '?'} ({memory}, driver {gpu.get('driver') or '?'}); "
             f"onnxruntime {report['onnxruntime']}; device `{report['device']}`; CPU: {report['host']['cpu']} "
             f"x {report['host']['logical_cores']}", "",
             "| model | engine | precision | batch | beam | identical to CPU | device ms | CPU ms | speed-up | captions/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['model']} | {r['engine']} | {r['precision']} | {r['batch']} | {r['beam']} | "
                     f"{r['identical']:.0%} of {r['captions_compared']} | {r['device_ms']:.2f} | {r['cpu_ms']:.1f} | "
                     f"{r['speedup']:.1f}x | {r['device_captions_per_s']:.0f} |")
    lines += ["", f"TensorRT: {report['tensorrt']}"]
    for s in report["skipped"]:
        lines.append(f"skipped: {s}")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> Path | None:
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        series: dict[tuple, list] = {}
        for r in rows:
            if r["model"] == model:
                series.setdefault((r["engine"], r["precision"], r["beam"]), []).append((r["batch"], r["device_ms"]))
        for (engine, precision, beam), points in sorted(series.items()):
            points.sort()
            ax.plot([b for b, _ in points], [ms for _, ms in points], marker="o",
                    label=f"{engine} {precision} beam {beam}")
        cpu = {}
        for r in rows:
            if r["model"] == model and r["engine"] == "onnxruntime" and r["precision"] in ("fp32", "tf32"):
                cpu.setdefault(r["beam"], {})[r["batch"]] = r["cpu_ms"]
        for beam, points in sorted(cpu.items()):
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], linestyle="--", color="grey", label=f"CPU provider beam {beam}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (images)")
        ax.set_ylabel("caption ms (median)")
        ax.set_title(model)
        ax.legend(fontsize=7)
    return save_png(fig, path)


def write_outputs(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
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
    report = {
        "device": device.name, "gpu": gpu_info() if device.name == "cuda" else {"name": "CPU provider as the device"},
        "onnxruntime": ort.__version__, "host": host_info(), "rows": [], "tensorrt": "not run yet", "skipped": [],
        "seconds": 0.0, "settings": {k: v for k, v in vars(args).items() if k not in ("out", "workdir")},
    }
    for job in progress_bar(jobs(args, workdir), desc="gpu_check", unit="setting"):
        name = f"{job.label} {job.precision} batch {job.batch}"
        if time.monotonic() > deadline:
            report["skipped"].append(f"{name}: time budget ({args.budget} s) spent")
            continue
        try:
            report["rows"] += run_job(job, device, args, workdir)
        except Exception as exc:  # noqa: BLE001 (one run on a lent machine: a failing setting is reported, the rest still run)
            report["skipped"].append(f"{name}: {type(exc).__name__}: {first_line(exc)}")
        report["seconds"] = time.monotonic() - start
        write_outputs(report, out)  # what is measured so far survives a kill
        print(f"gpu_check: {name} done at {report['seconds']:.0f} s", file=sys.stderr, flush=True)
    trt_rows, report["tensorrt"] = run_tensorrt(args, device, workdir, deadline)
    report["rows"] += trt_rows
    report["seconds"] = time.monotonic() - start
    write_outputs(report, out)
    print(markdown(report))
    fp32 = [r for r in report["rows"] if r["precision"] == "fp32"]
    mismatched = [r for r in fp32 if r["identical"] < 1.0]
    verdict = "fp32 tokens identical to the CPU provider" if fp32 and not mismatched else (
        f"fp32 tokens differ from the CPU provider in {len(mismatched)} of {len(fp32)} settings" if fp32
        else "no fp32 setting ran")
    print(f"gpu_check: {verdict}; {len(report['rows'])} settings in {report['seconds']:.0f} s; "
          f"results in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
