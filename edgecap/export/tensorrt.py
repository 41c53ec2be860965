"""TensorRT engines from the bundle's ONNX graphs (the `tensorrt` Python API, imported lazily).

One engine per (graph, batch): every ONNX graph is static, so each engine has exactly one
shape and needs no optimisation profile. The builder uses a workspace limit and a persistent
timing cache file (kernel timings survive across builds, which makes the second build of a
bundle much faster). TensorRT 10 and 11 are supported (their APIs were checked against the
real bindings of 10.0, 10.3, 10.16, 11.0 and 11.4: docs/export.md, "TensorRT versions").

Precision is the ONNX graph's own: networks are built strongly typed, the only kind TensorRT
11 has (10 has it behind `NetworkDefinitionCreationFlag.STRONGLY_TYPED`; 11 removed
`BuilderFlag.FP16` / `INT8`, per-layer precision and the INT8 calibrators). So
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
Each engine's manifest entry records the TensorRT version, GPU name and compute capability it
was built for; the runtime refuses it anywhere else.

Large visual graphs (a ViT-L/14 front end: 304 M parameters, 1.2 GB of fp32 ONNX) need the
parser reading the file itself (`parse_from_file`), not a bytes copy held in Python, so
weights stored as ONNX external data are found beside the graph too, and a workspace large
enough for the attention tactics (`--workspace`, MiB; the Jetson preset gives 1024).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError
from edgecap.io import atomic_path
from edgecap.runtime.engines import tensorrt_major, tensorrt_module

IMPLICIT_INT8_MAJORS = (10,)  # TensorRT 11 removed the INT8 calibrators and BuilderFlag.INT8


def trt_majors(*majors: int):
    """Mark a function whose TensorRT calls exist on these majors only: the offline API check
    (benchmarks/_trt_api.py) checks its uses against those releases alone."""
    def mark(fn):
        fn.trt_majors = majors
        return fn
    return mark


def _trt():
    return tensorrt_module("TensorRT engines")


def require_int8_mode(trt, int8_mode: str) -> None:
    if int8_mode == "calibrator" and tensorrt_major(trt.__version__) not in IMPLICIT_INT8_MAJORS:
        raise EdgecapError(f"--int8-mode calibrator needs TensorRT 10 (implicit quantization was removed in "
                           f"TensorRT 11; this machine has {trt.__version__}): use --int8-mode qdq")


def engine_name(role: str, rows: int, precision: str) -> str:
    return f"{role}.b{rows}.{precision}.engine"


def _parse(trt, builder, logger, onnx_path: Path, strongly_typed: bool):
    # TensorRT 10 and 11 networks are explicit-batch; 11 ignores STRONGLY_TYPED (it is always on)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EdgecapError(f"TensorRT cannot parse {onnx_path.name}: {'; '.join(errors[:3])}")
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        if any(d < 0 for d in tensor.shape):
            raise EdgecapError(f"{onnx_path.name}: input {tensor.name!r} has dynamic shape {tuple(tensor.shape)}")
    return network, parser


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


@trt_majors(*IMPLICIT_INT8_MAJORS)
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


@trt_majors(*IMPLICIT_INT8_MAJORS)
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


@trt_majors(*IMPLICIT_INT8_MAJORS)
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


def build_engine(onnx_path: Path, engine_path: Path, precision: str, workspace_mb: int = 1024,
                 timing_cache: Path | None = None, int8_mode: str = "qdq",
                 calibration_feeds: list[dict] | None = None) -> dict:
    """Build and write one engine; -> the manifest's `tensorrt` record."""
    trt = _trt()
    from edgecap.runtime.engines import local_gpu

    implicit = precision == "int8" and int8_mode == "calibrator"
    require_int8_mode(trt, int8_mode if precision == "int8" else "qdq")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network, _parser = _parse(trt, builder, logger, onnx_path, strongly_typed=not implicit)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb) << 20)
    cache = None
    if timing_cache is not None:
        cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
    if precision == "fp32":
        config.clear_flag(trt.BuilderFlag.TF32)  # fp32 means fp32: TF32 matmuls break token parity
    calib_cache = engine_path.with_suffix(".calib")
    if implicit:
        fp32_norms = _implicit_int8(trt, builder, network, config, onnx_path, calibration_feeds, calib_cache)
    else:
        found = graph_precision(trt, network)
        require_graph_precision(found, precision, onnx_path)
        fp32_norms = found["fp32_norms"] if precision != "fp32" else 0
    try:
        plan = builder.build_serialized_network(network, config)
    finally:
        calib_cache.unlink(missing_ok=True)  # the bundle holds only files its manifest lists
    if plan is None:
        raise EdgecapError(f"TensorRT failed to build an engine from {onnx_path.name} (see the log above)")
    with atomic_path(engine_path) as tmp:
        tmp.write_bytes(bytes(plan))
    if cache is not None:
        with atomic_path(timing_cache) as tmp:
            tmp.write_bytes(bytes(cache.serialize()))
    gpu, cc = local_gpu()
    return {"version": trt.__version__, "gpu": gpu, "compute_capability": cc, "workspace_mb": int(workspace_mb),
            "int8_mode": int8_mode if precision == "int8" else "", "fp32_layers": fp32_norms}
