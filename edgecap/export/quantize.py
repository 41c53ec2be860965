"""Reduced-precision ONNX graphs with onnxruntime's own tools.

- int8 dynamic: weights of MatMul / Gemm stored as int8, activations quantised per call
  (`quantize_dynamic`); no calibration data, the onnxruntime CPU path.
- int8 static: QDQ (QuantizeLinear / DequantizeLinear) pairs with scales calibrated on
  representative inputs (`quantize_static`, symmetric int8): the explicit-quantization form
  TensorRT builds INT8 engines from, and onnxruntime runs on CPU too.
- fp16: initialisers and arithmetic in float16 with float32 graph inputs and outputs, so the
  runtime's buffers and the cache stay float32.
Graphs without MatMul-heavy work (a small CNN front end) are left in fp32 by dynamic
quantization; each manifest entry records the precision it really has.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError, require

DYNAMIC_OPS = ["MatMul", "Gemm"]
STATIC_OPS = ["MatMul", "Gemm", "Conv"]


def _has_ops(path: Path, ops) -> bool:
    import onnx

    return any(n.op_type in ops for n in onnx.load(str(path)).graph.node)


def linear_layers(path: Path) -> list[str]:
    """MatMul / Gemm nodes whose second input is a 2-D weight initialiser: the linear layers.

    Only these get int8 weights (one scale per output column). The other constant MatMuls,
    e.g. the learned memory slots' keys and values multiplied per head, are attention
    operands: onnxruntime's int8 kernels accept one scale per column of a 2-D weight only, and
    per-tensor scales on them were the largest int8 error on the trained demo model.
    """
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    rank = {t.name: len(t.dims) for t in graph.initializer}
    return [n.name for n in graph.node
            if n.op_type in DYNAMIC_OPS and len(n.input) > 1 and rank.get(n.input[1]) == 2]


class _Feeds:
    """onnxruntime's CalibrationDataReader over a list of feed dicts."""

    def __init__(self, feeds: list[dict[str, np.ndarray]], names: list[str]):
        self._iter = iter([{k: v for k, v in f.items() if k in names} for f in feeds])

    def get_next(self):
        return next(self._iter, None)


def _without_value_info(src: Path, dst: Path) -> Path:
    """A copy of `src` without intermediate shape annotations, beside `dst`.

    The quantizer re-infers shapes and stops at the first annotation it disagrees with; the
    exporter's annotations of LSTM gate tensors ([4H] vs [H]) are such a case.
    """
    import onnx

    model = onnx.load(str(src))
    if not len(model.graph.value_info):
        return src
    del model.graph.value_info[:]
    clean = dst.with_name(f".{dst.stem}.noshapes.onnx")
    onnx.save(model, str(clean))
    return clean


def quantize_int8(src: Path, dst: Path, mode: str, feeds: list[dict] | None = None) -> str:
    """Write an int8 version of `src` to `dst`; -> the precision written ("int8" or "fp32")."""
    require("onnxruntime.quantization", "train", "int8 quantization")
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    ops = DYNAMIC_OPS if mode == "dynamic" else STATIC_OPS
    if not _has_ops(src, ops):
        if src != dst:
            dst.write_bytes(src.read_bytes())
        return "fp32"
    original, src = src, _without_value_info(src, dst)
    quiet = io.StringIO()
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(quiet):
            if mode == "dynamic":
                quantize_dynamic(str(src), str(dst), op_types_to_quantize=ops, weight_type=QuantType.QInt8,
                                 per_channel=True, nodes_to_quantize=linear_layers(src))
            elif mode == "static":
                if not feeds:
                    raise EdgecapError(f"static int8 quantization of {src.name} needs calibration inputs")
                import onnx

                names = [i.name for i in onnx.load(str(src)).graph.input]
                quantize_static(
                    str(src), str(dst), _Feeds(feeds, names), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, op_types_to_quantize=ops,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
                )
            else:
                raise EdgecapError(f"int8 quantization mode {mode!r}, expected dynamic or static")
    except EdgecapError:
        raise
    except Exception as exc:
        raise EdgecapError(f"int8 quantization of {src.name} failed: {str(exc).splitlines()[0][:200]}") from exc
    finally:
        logging.getLogger().setLevel(level)
        if src != original:
            src.unlink(missing_ok=True)
    return "int8"


def convert_fp16(src: Path, dst: Path) -> str:
    require("onnx", "train", "fp16 conversion")
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dst))
    return "fp16"
