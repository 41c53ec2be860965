"""TensorRT engines from the bundle's ONNX graphs (the `tensorrt` Python API, imported lazily).

One engine per (graph, batch): every ONNX graph is static, so each engine has exactly one
shape and needs no optimisation profile. The builder uses an explicit-batch network, a
workspace limit, and a persistent timing cache file (kernel timings survive across builds,
which makes the second build of a bundle much faster). Precision:
- fp16: BuilderFlag.FP16, refused where the GPU has no fast fp16;
- int8 "qdq": explicit quantization, the ONNX graph already carries calibrated QDQ scales
  (written by quantize.py), so the builder only needs the INT8 flag;
- int8 "calibrator": implicit quantization with an entropy calibrator fed the representative
  inputs that calibration.py recorded from the fp32 bundle.
Each engine's manifest entry records the TensorRT version, GPU name and compute capability it
was built for; the runtime refuses it anywhere else.

Large visual graphs (a ViT-L/14 front end: 304 M parameters, 1.2 GB of fp32 ONNX) need:
- the parser reading the file itself (`parse_from_file`), not a bytes copy held in Python, so
  weights stored as ONNX external data are found beside the graph too;
- under fp16 / int8, every normalisation layer (LayerNormalization: 2 x 24 in a ViT-L, and
  the final `ln_post`) kept in fp32 with `PREFER_PRECISION_CONSTRAINTS`: a LayerNorm's
  variance over 1024 channels of a residual stream with outlier channels overflows fp16's
  65504 (the failure TensorRT's own builder warns about for transformer graphs); everything
  else, the matmuls that are the ViT's time, runs in fp16;
- a workspace large enough for the attention tactics (`--workspace`, MiB; the Jetson preset
  gives 1024, a ViT-L at batch 4 is measured there, not here).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError, require
from edgecap.io import atomic_path


def _trt():
    return require("tensorrt", "trt", "TensorRT engines")


def engine_name(role: str, rows: int, precision: str) -> str:
    return f"{role}.b{rows}.{precision}.engine"


def _parse(trt, builder, logger, onnx_path: Path):
    flags = 0
    explicit = getattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH", None)
    if explicit is not None:  # TensorRT < 10; 10 makes every network explicit-batch
        flags |= 1 << int(explicit)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if hasattr(parser, "parse_from_file"):
        ok = parser.parse_from_file(str(onnx_path))
    else:  # pragma: no cover - TensorRT < 8
        ok = parser.parse(onnx_path.read_bytes())
    if not ok:
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EdgecapError(f"TensorRT cannot parse {onnx_path.name}: {'; '.join(errors[:3])}")
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        if any(d < 0 for d in tensor.shape):
            raise EdgecapError(f"{onnx_path.name}: input {tensor.name!r} has dynamic shape {tuple(tensor.shape)}")
    return network, parser


def keep_norms_fp32(trt, network, config) -> int:
    """Pin every normalisation layer (and its output) to fp32 in a reduced-precision build;
    -> how many layers were pinned."""
    norm = getattr(trt.LayerType, "NORMALIZATION", None)
    if norm is None:  # pragma: no cover - TensorRT < 8.6 has no LayerNormalization layer
        return 0
    pinned = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == norm:
            layer.precision = trt.float32
            for k in range(layer.num_outputs):
                layer.set_output_type(k, trt.float32)
            pinned += 1
    if pinned:
        config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
    return pinned


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


def build_engine(onnx_path: Path, engine_path: Path, precision: str, workspace_mb: int = 1024,
                 timing_cache: Path | None = None, int8_mode: str = "qdq",
                 calibration_feeds: list[dict] | None = None) -> dict:
    """Build and write one engine; -> the manifest's `tensorrt` record."""
    trt = _trt()
    from edgecap.runtime.engines import local_gpu

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network, _parser = _parse(trt, builder, logger, onnx_path)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb) << 20)
    cache = None
    if timing_cache is not None:
        cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
    if precision == "fp32" and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # fp32 means fp32: TF32 matmuls break token parity
    if precision == "fp16" or precision == "int8":
        if not builder.platform_has_fast_fp16:
            raise EdgecapError(f"this GPU has no fast fp16; build {precision} elsewhere or use --precision fp32")
        config.set_flag(trt.BuilderFlag.FP16)  # int8 layers fall back to fp16, not fp32
        fp32_norms = keep_norms_fp32(trt, network, config)
    if precision == "int8":
        if not builder.platform_has_fast_int8:
            raise EdgecapError("this GPU has no fast int8; use --precision fp16")
        config.set_flag(trt.BuilderFlag.INT8)
        if int8_mode == "calibrator":
            if not calibration_feeds:
                raise EdgecapError(f"INT8 calibration of {onnx_path.name} needs representative inputs")
            config.int8_calibrator = _calibrator(trt, calibration_feeds, engine_path.with_suffix(".calib"))
    calib_cache = engine_path.with_suffix(".calib")
    try:
        plan = builder.build_serialized_network(network, config)
    finally:
        calib_cache.unlink(missing_ok=True)  # the bundle holds only files its manifest lists
    if plan is None:
        raise EdgecapError(f"TensorRT failed to build an engine from {onnx_path.name} (see the log above)")
    with atomic_path(engine_path) as tmp:
        tmp.write_bytes(bytes(plan))
    if timing_cache is not None and cache is not None:
        with atomic_path(timing_cache) as tmp:
            tmp.write_bytes(bytes(config.get_timing_cache().serialize()))
    gpu, cc = local_gpu()
    return {"version": trt.__version__, "gpu": gpu, "compute_capability": cc, "workspace_mb": int(workspace_mb),
            "int8_mode": int8_mode if precision == "int8" else "",
            "fp32_layers": fp32_norms if precision in ("fp16", "int8") else 0}
