"""TensorRT engines from the bundle's ONNX graphs, with TensorRT or TensorRT for RTX.

Which of the two builds (`--tensorrt auto|tensorrt|tensorrt-rtx`) and everything that differs
between them is edgecap.runtime.tensorrt_dist; this module is the one build path for both.

One engine per (graph, batch): every ONNX graph is static, so each engine has exactly one
shape and needs no optimisation profile. TensorRT 10 and 11 build on the GPU they will run on,
with a workspace limit and a persistent timing cache beside the bundle (kernel timings survive
across builds, which makes the second build of a bundle much faster); their APIs were checked
against the real bindings of 10.0, 10.3, 10.16, 11.0 and 11.4 (docs/export.md). TensorRT for
RTX builds without a GPU for every compute capability it compiles for (Ampere 8.0 and up), has
no timing cache (its kernels are compiled when an engine first runs, and kept then: the
runtime's runtime cache) and was checked against the installed 1.7.

The real ONNX parser is the compatibility check (`parser_problems`): its errors, in its own
words, go into the manifest's `checks` and the export's error; a graph it parses but the
builder cannot build fails the export with the builder's own words. Build progress comes from
TensorRT's IProgressMonitor (a bar per engine).

Precision is the ONNX graph's own: networks are built strongly typed, the only kind TensorRT
11 and TensorRT for RTX have (10 has it behind `NetworkDefinitionCreationFlag.STRONGLY_TYPED`;
11 removed `BuilderFlag.FP16` / `INT8`, per-layer precision and the INT8 calibrators). So
- fp32: the fp32 graph, TF32 disabled (TF32 matmuls break token parity);
- fp16: the fp16 graph the export writes (`quantize.convert_fp16`, I/O kept fp32), in which
  every LayerNormalization stays fp32: a LayerNorm's variance over 1024 channels of a ViT's
  residual stream with outlier channels overflows fp16's 65504;
- int8 "qdq": explicit quantization, the static-QDQ graph (quantize.py) with calibrated scales;
- int8 "calibrator" (TensorRT 10 only): implicit quantization, a weakly typed network with
  the FP16 and INT8 flags, an entropy calibrator fed the representative inputs calibration.py
  recorded from the fp32 bundle, and every normalisation layer pinned to fp32.
A graph whose tensors do not hold the precision asked for (an fp32 graph for an fp16 engine)
is refused, so an engine's precision label is always what it computes in.
Each engine's manifest entry records the distribution, its version and the compute
capabilities the engine runs on; the runtime refuses it anywhere else, in one line.

Large visual graphs (a ViT-L/14 front end: 304 M parameters, 1.2 GB of fp32 ONNX) need the
parser reading the file itself (`parse_from_file`), not a bytes copy held in Python, so
weights stored as ONNX external data are found beside the graph too, and a workspace large
enough for the attention tactics (`--workspace`, MiB; the Jetson preset gives 1024).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecap.contract.manifest import ParityNotRun, TensorRTInfo
from edgecap.errors import EdgecapError
from edgecap.io import atomic_path
from edgecap.progress import progress_bar
from edgecap.runtime.engines import (
    TRT_DTYPES,
    check_io_table,
    find_gpu,
    local_gpu,
    why_engine_cannot_run,
)
from edgecap.runtime.tensorrt_dist import (
    IMPLICIT_INT8_RELEASES,
    RTX_RELEASES,
    TENSORRT,
    TENSORRT_RELEASES,
    TENSORRT_RTX,
    Distribution,
    compute_capabilities,
    load,
    of_module,
    trt_apis,
)

# onnxruntime-only ops the parser refuses, with what to export instead (said after its words)
EXPORT_HINTS = {
    "MatMulNBits": "weight-only int8 (--quantize weight-only) is onnxruntime's; TensorRT builds int8 from QDQ graphs",
    "MatMulInteger": "dynamic int8 is onnxruntime's; TensorRT builds int8 from QDQ graphs (--engine trt --precision int8)",
    "DynamicQuantizeLinear": "dynamic int8 is onnxruntime's; TensorRT builds int8 from QDQ graphs "
                             "(--engine trt --precision int8)",
}


def require_options(trt, precision: str, int8_mode: str, timing_cache: str | Path | None) -> None:
    """Refuse, in one line, what the installed distribution cannot honour (before any work)."""
    dist = of_module(trt)
    release = dist.release(trt.__version__)
    if precision == "int8" and int8_mode == "calibrator" and release not in IMPLICIT_INT8_RELEASES:
        why = ("TensorRT for RTX builds strongly typed networks only" if dist is TENSORRT_RTX
               else "implicit quantization was removed in TensorRT 11")
        raise EdgecapError(f"--int8-mode calibrator needs TensorRT 10 ({why}; this machine has "
                           f"{dist.describe(trt.__version__)}): use --int8-mode qdq")
    if timing_cache and dist.cache != "timing":
        raise EdgecapError(f"--timing-cache {timing_cache}: {dist.title} has no timing cache (it compiles kernels when "
                           f"an engine first runs, and edgecap run keeps them in a runtime cache beside the bundle); "
                           f"drop --timing-cache")


def engine_name(role: str, rows: int, precision: str) -> str:
    return f"{role}.b{rows}.{precision}.engine"


def _build_log(trt):
    """A TensorRT logger that keeps what the parser and builder say (errors go into the export's
    error and the manifest's checks, in TensorRT's words) and prints nothing itself."""

    class BuildLog(trt.ILogger):
        def __init__(self):
            super().__init__()
            self.errors: list[str] = []
            self.warnings: list[str] = []

        def log(self, severity, msg):
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                self.errors.append(str(msg).strip())
            elif severity == trt.ILogger.Severity.WARNING:
                self.warnings.append(str(msg).strip())

    return BuildLog()


def _progress_monitor(trt, bar):
    """TensorRT's IProgressMonitor driving `bar`: its top phase's steps, the current phase as text."""

    class BuildProgress(trt.IProgressMonitor):
        def __init__(self):
            super().__init__()
            self.top, self.steps, self.done = None, 0, 0

        def phase_start(self, phase_name, parent_phase, num_steps):
            if parent_phase is None:
                self.top, self.steps, self.done = phase_name, num_steps, 0
                bar.reset(total=num_steps)
            bar.set_postfix_str(phase_name, refresh=False)

        def step_complete(self, phase_name, step):
            if phase_name == self.top:
                self.done += 1
                bar.update()
            return True  # never cancel the build

        def phase_finish(self, phase_name):
            if phase_name == self.top and self.done < self.steps:  # TensorRT may finish a phase early
                bar.update(self.steps - self.done)
                self.done = self.steps
            bar.refresh()

    return BuildProgress()


def _parse(trt, builder, build_log, onnx_path: Path, strongly_typed: bool):
    # explicit-batch networks; 11 and TensorRT for RTX ignore STRONGLY_TYPED (it is always on)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, build_log)
    problems = []
    if not parser.parse_from_file(str(onnx_path)):
        problems = [_parser_words(parser.get_error(i)) for i in range(parser.num_errors)]
        problems = problems or build_log.errors[-3:] or ["the parser gives no reason"]
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        if any(d < 0 for d in tensor.shape):
            problems.append(f"input {tensor.name!r} has dynamic shape {tuple(tensor.shape)}")
    return network, parser, problems


def _parser_words(error) -> str:
    """The parser's own message on one line, and what to export instead where edgecap knows."""
    # a parser without a GPU also logs that CUDA found no driver: not about the graph
    lines = [line.strip() for line in str(error).splitlines() if line.strip() and "catchCudaError" not in line]
    words = " | ".join(lines)
    hint = EXPORT_HINTS.get(error.node_operator())
    return f"{words} ({hint})" if hint else words


def parser_problems(onnx_path: Path, dist: Distribution) -> list[str]:
    """What the real TensorRT ONNX parser of `dist` makes of a graph: its errors in its own
    words, and any input left with a dynamic shape; [] when it parses a static network."""
    trt = load(dist, "TensorRT compatibility checks")
    build_log = _build_log(trt)
    builder = trt.Builder(build_log)
    _network, _parser, problems = _parse(trt, builder, build_log, Path(onnx_path), strongly_typed=True)
    return problems


def graph_precision(trt, network) -> dict:
    """What the parsed graph computes in: {"fp16": any fp16 tensor, "int8": any Quantize layer,
    "fp32_norms": normalisation layers whose output stays fp32}."""
    found = {"fp16": False, "int8": False, "fp32_norms": 0}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        found["int8"] |= layer.type == trt.LayerType.QUANTIZE
        outputs = [layer.get_output(k) for k in range(layer.num_outputs)]
        dtypes = [output.dtype for output in outputs]
        found["fp16"] |= trt.float16 in dtypes
        found["fp32_norms"] += layer.type == trt.LayerType.NORMALIZATION and dtypes == [trt.float32] * len(dtypes)
    return found


def require_graph_precision(found: dict, precision: str, onnx_path: Path) -> None:
    """A strongly typed engine computes in the graph's own types: refuse a label it would not earn."""
    if (precision == "fp16" and not found["fp16"]) or (precision == "int8" and not found["int8"]):
        holds = "QDQ int8" if found["int8"] else "fp16" if found["fp16"] else "fp32"
        raise EdgecapError(f"{onnx_path.name} computes in {holds}, not {precision}: TensorRT builds strongly "
                           f"typed engines at the graph's own precision; export the checkpoint with "
                           f"--engine trt --precision {precision}")


def network_bindings(trt, network) -> dict:
    """{name: (mode, dtype, shape)} of the network's inputs and outputs: the engine's bindings."""
    listed = [("input", network.get_input(i)) for i in range(network.num_inputs)]
    listed += [("output", network.get_output(i)) for i in range(network.num_outputs)]
    return {tensor.name: (mode, TRT_DTYPES.get(tensor.dtype.name, tensor.dtype.name), [int(d) for d in tensor.shape])
            for mode, tensor in listed}


@trt_apis(*IMPLICIT_INT8_RELEASES)
def keep_norms_fp32(trt, network, config) -> int:
    """Pin every normalisation layer (and its output) to fp32 in a weakly typed reduced-precision
    build; -> how many layers were pinned."""
    pinned = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == trt.LayerType.NORMALIZATION:
            layer.precision = trt.float32
            for k in range(layer.num_outputs):
                layer.set_output_type(k, trt.float32)
            pinned += 1
    if pinned:
        config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
    return pinned


@trt_apis(*IMPLICIT_INT8_RELEASES)
def _calibrator(trt, feeds: list[dict[str, np.ndarray]], cache_path: Path):
    """An IInt8EntropyCalibrator2 over recorded feed dicts (device memory via cuda-python)."""
    from edgecap.runtime.engines import _check, _cudart

    cudart = _cudart()

    class FeedCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            super().__init__()
            self.feeds = iter(feeds)
            self.buffers: dict[str, int] = {}

        def get_batch_size(self):
            return 1  # explicit-batch networks take the batch from the tensors themselves

        def get_batch(self, names):
            feed = next(self.feeds, None)
            if feed is None:
                return None
            ptrs = []
            for name in names:
                value = np.ascontiguousarray(feed[name])
                if name not in self.buffers:
                    self.buffers[name] = int(_check(cudart.cudaMalloc(max(1, value.nbytes)), "cudaMalloc"))
                _check(cudart.cudaMemcpy(self.buffers[name], value.ctypes.data, value.nbytes,
                                         cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
                ptrs.append(self.buffers[name])
            return ptrs

        def read_calibration_cache(self):
            return cache_path.read_bytes() if cache_path.is_file() else None

        def write_calibration_cache(self, cache):
            with atomic_path(cache_path) as tmp:
                tmp.write_bytes(bytes(cache))

        def __del__(self):
            for ptr in self.buffers.values():
                cudart.cudaFree(ptr)

    return FeedCalibrator()


@trt_apis(*IMPLICIT_INT8_RELEASES)
def _implicit_int8(trt, builder, network, config, onnx_path: Path, feeds, cache_path: Path) -> int:
    """Weakly typed INT8 with a calibrator (int8 layers falling back to fp16, norms fp32);
    -> how many normalisation layers were pinned to fp32."""
    if not builder.platform_has_fast_int8 or not builder.platform_has_fast_fp16:
        raise EdgecapError("this GPU has no fast int8 / fp16; use --precision fp32")
    if not feeds:
        raise EdgecapError(f"INT8 calibration of {onnx_path.name} needs representative inputs")
    config.set_flag(trt.BuilderFlag.FP16)
    config.set_flag(trt.BuilderFlag.INT8)
    pinned = keep_norms_fp32(trt, network, config)
    config.int8_calibrator = _calibrator(trt, feeds, cache_path)
    return pinned


@trt_apis(*TENSORRT_RELEASES)
def _use_timing_cache(config, path: Path):
    """The builder's kernel timings from (and, after the build, back to) `path`."""
    cache = config.create_timing_cache(path.read_bytes() if path.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    return cache


@trt_apis(*RTX_RELEASES)
def _target_compute_capabilities(trt, config) -> list[str]:
    """Build for every compute capability edgecap targets (tensorrt_dist.compute_capabilities)."""
    targets = compute_capabilities(trt)
    config.num_compute_capabilities = len(targets)
    for i, cc in enumerate(targets):
        config.set_compute_capability(getattr(trt.ComputeCapability, "SM" + cc.replace(".", "")), i)
    return targets


def _where_built(dist: Distribution, targets: list[str]) -> dict:
    """The manifest's record of the GPU: full TensorRT builds for the GPU it runs on; TensorRT
    for RTX for `targets`, on whatever GPU this is, or none."""
    if dist is TENSORRT_RTX:
        gpu, _why = find_gpu()
        return {"gpu": gpu[0] if gpu else "", "compute_capability": targets[0], "compute_capabilities": targets}
    gpu, cc = local_gpu()
    return {"gpu": gpu, "compute_capability": cc, "compute_capabilities": [cc]}


def _build_bar(onnx_path: Path, progress: bool):
    return progress_bar(total=1, desc=f"TensorRT {onnx_path.stem}", unit="step", leave=False, quiet=not progress)


def build_engine(onnx_path: Path, engine_path: Path, precision: str, dist: Distribution = TENSORRT,
                 workspace_mb: int = 1024, timing_cache: Path | None = None, int8_mode: str = "qdq",
                 calibration_feeds: list[dict] | None = None, source_entry=None, progress: bool = False,
                 bar=None) -> TensorRTInfo:
    """Build and write one engine; -> the manifest's `tensorrt` record of it.

    source_entry: the ONNX graph's manifest entry; the network TensorRT parsed (the engine's
    bindings) must have exactly its inputs and outputs. bar: a tqdm-like bar the build's
    progress drives (default: a bar of its own, shown when `progress`)."""
    trt = load(dist, "TensorRT engines")
    implicit = precision == "int8" and int8_mode == "calibrator"
    require_options(trt, precision, int8_mode, timing_cache if dist.cache != "timing" else None)
    build_log = _build_log(trt)
    builder = trt.Builder(build_log)
    network, _parser, problems = _parse(trt, builder, build_log, onnx_path, strongly_typed=not implicit)
    if problems:
        raise EdgecapError(f"{dist.title} cannot parse {onnx_path.name}: {'; '.join(problems[:3])}")
    if source_entry is not None:
        check_io_table(network_bindings(trt, network), source_entry, onnx_path, "parsed network")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb) << 20)
    cache = _use_timing_cache(config, timing_cache) if timing_cache is not None and dist.cache == "timing" else None
    targets = _target_compute_capabilities(trt, config) if dist is TENSORRT_RTX else []
    if precision == "fp32":
        config.clear_flag(trt.BuilderFlag.TF32)  # fp32 means fp32: TF32 matmuls break token parity
    calib_cache = engine_path.with_suffix(".calib")
    if implicit:
        fp32_norms = _implicit_int8(trt, builder, network, config, onnx_path, calibration_feeds, calib_cache)
    else:
        found = graph_precision(trt, network)
        require_graph_precision(found, precision, onnx_path)
        fp32_norms = found["fp32_norms"] if precision != "fp32" else 0
    own_bar = bar is None
    bar = _build_bar(onnx_path, progress) if own_bar else bar
    monitor = _progress_monitor(trt, bar)
    config.progress_monitor = monitor
    try:
        plan = builder.build_serialized_network(network, config)
    finally:
        calib_cache.unlink(missing_ok=True)  # the bundle holds only files its manifest lists
        if own_bar:
            bar.close()
    if plan is None:
        said = "; ".join(build_log.errors[-3:]) or "it gives no reason"
        raise EdgecapError(f"{dist.title} {trt.__version__} cannot build an engine from {onnx_path.name}: {said}")
    with atomic_path(engine_path) as tmp:
        tmp.write_bytes(bytes(plan))
    if cache is not None:
        with atomic_path(timing_cache) as tmp:
            tmp.write_bytes(bytes(cache.serialize()))
    return TensorRTInfo.from_dict({"distribution": dist.name, "version": trt.__version__, **_where_built(dist, targets),
                                   "workspace_mb": int(workspace_mb), "int8_mode": int8_mode if precision == "int8" else "",
                                   "fp32_layers": fp32_norms}, f"{engine_path.name}'s tensorrt record")


def timing_cache_path(settings, out: Path, dist: Distribution) -> Path | None:
    """TensorRT's timing cache: --timing-cache, else beside the bundle (the bundle holds only the
    files its manifest lists); TensorRT for RTX has none."""
    if settings.timing_cache:
        return Path(settings.timing_cache)
    return out.with_name(out.name + ".timing-cache") if dist.cache == "timing" else None


def engines_not_run(manifest, root: Path, precision: str, named: Path | None = None) -> ParityNotRun | None:
    """The parity record of engines this machine cannot run (no GPU, or one they were not built
    for: TensorRT for RTX builds without one), saying why; None when they can run here.
    named: the bundle's path in the advice (default: root)."""
    engine = next(g for g in manifest.graphs if g.engine == "tensorrt")
    why = why_engine_cannot_run(engine, named or root, advice=False)
    return ParityNotRun(precision, why) if why else None
