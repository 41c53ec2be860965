"""Reduced-precision ONNX graphs with onnxruntime's own tools.

- int8 dynamic: weights of MatMul / Gemm stored as int8, activations quantised per call
  (`quantize_dynamic`); no calibration data, the onnxruntime CPU path.
- int8 static: QDQ (QuantizeLinear / DequantizeLinear) pairs with scales calibrated on
  representative inputs (`quantize_static`, symmetric int8): the explicit-quantization form
  TensorRT builds INT8 engines from, and onnxruntime runs on CPU too.
- int8 weight-only: the decoder step's linear layers as onnxruntime's `com.microsoft.MatMulNBits`
  (8-bit weights in blocks, activations quantised inside the kernel), the fastest int8 at one
  decoder row; the other graphs dynamic (`graph_mode`). onnxruntime only: TensorRT cannot
  parse the contrib op.
- fp16: initialisers and arithmetic in float16 with float32 graph inputs and outputs, so the
  runtime's buffers and the cache stay float32.
Graphs without MatMul-heavy work (a small CNN front end) are left in fp32 by dynamic
quantization; each manifest entry records the precision it really has.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
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

    return _linear_nodes(onnx.load(str(path), load_external_data=False).graph)


def _linear_nodes(graph) -> list[str]:
    rank = {t.name: len(t.dims) for t in graph.initializer}
    return [n.name for n in graph.node
            if n.op_type in DYNAMIC_OPS and len(n.input) > 1 and rank.get(n.input[1]) == 2]


class _Feeds:
    """onnxruntime's CalibrationDataReader over a list of feed dicts."""

    def __init__(self, feeds: list[dict[str, np.ndarray]], names: list[str]):
        self._iter = iter([{k: v for k, v in f.items() if k in names} for f in feeds])

    def get_next(self):
        return next(self._iter, None)


def gemm_as_matmul(model) -> int:
    """Rewrite, in place, each Gemm of a linear layer (a 2-D weight initialiser, alpha = beta = 1,
    A not transposed) as MatMul(A, W) + Add(bias); -> how many were rewritten.

    The exporters write a linear layer on a 2-D input (the decoder step's [rows, d]) as one
    Gemm, and onnxruntime's dynamic quantizer has no integer Gemm: it would leave those weights
    in fp32. onnxruntime fuses MatMul + Add back into Gemm where it keeps fp32.
    """
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes, rewritten, replaced = [], 0, set()
    for node in graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        weight = weights.get(node.input[1]) if node.op_type == "Gemm" and len(node.input) > 1 else None
        if (weight is None or len(weight.dims) != 2 or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weight)
        replaced.add(node.input[1])
        name = f"{node.input[1]}.matmul"
        if name not in weights:
            weights[name] = numpy_helper.from_array(w.T.copy() if attrs.get("transB", 0) else w, name)
            graph.initializer.append(weights[name])
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        product = f"{node.output[0]}.matmul" if bias else node.output[0]
        nodes.append(onnx.helper.make_node("MatMul", [node.input[0], name], [product], name=f"{node.name or node.output[0]}.matmul"))
        if bias:
            nodes.append(onnx.helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name or node.output[0]}.bias"))
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        for t in [t for t in graph.initializer if t.name in replaced and t.name not in used]:
            graph.initializer.remove(t)
    return rewritten


def _prepared(src: Path, dst: Path, unfold_gemm: bool) -> Path:
    """A copy of `src` beside `dst` without intermediate shape annotations, and with linear
    Gemms unfolded (`gemm_as_matmul`) if asked; `src` itself when neither changes anything.

    The quantizer re-infers shapes and stops at the first annotation it disagrees with; the
    exporter's annotations of LSTM gate tensors ([4H] vs [H]) are such a case.
    """
    import onnx

    model = onnx.load(str(src))
    unfolded = gemm_as_matmul(model) if unfold_gemm else 0
    if not len(model.graph.value_info) and not unfolded:
        return src
    del model.graph.value_info[:]
    clean = dst.with_name(f".{dst.stem}.prepared.onnx")
    onnx.save(model, str(clean))
    return clean


def quantize_int8(src: Path, dst: Path, mode: str, feeds: list[dict] | None = None, quantize_bias: bool = True) -> str:
    """Write an int8 version of `src` to `dst`; -> the precision written ("int8" or "fp32").

    quantize_bias: static QDQ's biases as int32 (onnxruntime's default, which its CPU kernels
    fuse); False keeps them float, the QDQ form TensorRT builds (its parser refuses an int32
    DequantizeLinear: "input has type Int32 but must have type FP8, FP4, Int4, Int8, or UInt8")."""
    if mode == "weight-only":
        return quantize_weight_only(src, dst, WEIGHT_ONLY)
    require("onnxruntime.quantization", "train", "int8 quantization")
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    ops = DYNAMIC_OPS if mode == "dynamic" else STATIC_OPS
    if not _has_ops(src, ops):
        if src != dst:
            dst.write_bytes(src.read_bytes())
        return "fp32"
    original, src = src, _prepared(src, dst, unfold_gemm=mode == "dynamic")
    try:
        with _quantizer_errors(src.name):
            if mode == "dynamic":
                quantize_dynamic(str(src), str(dst), op_types_to_quantize=ops, weight_type=QuantType.QInt8,
                                 per_channel=True, nodes_to_quantize=linear_layers(src))
            elif mode == "static":
                if not feeds:
                    raise EdgecapError(f"static int8 quantization of {src.name} needs calibration inputs")
                quantize_static(
                    str(src), str(dst), _Feeds(feeds, _input_names(src)), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, op_types_to_quantize=ops,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                                   "QuantizeBias": quantize_bias},
                )
            else:
                raise EdgecapError(f"int8 quantization mode {mode!r}, expected dynamic, static or weight-only")
    finally:
        if src != original:
            src.unlink(missing_ok=True)
    return "int8"


def _input_names(path: Path) -> list[str]:
    import onnx

    return [i.name for i in onnx.load(str(path), load_external_data=False).graph.input]


@contextlib.contextmanager
def _quantizer_errors(name: str):
    """onnxruntime's quantizers print and log every node: quiet; their failures as one line."""
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    except EdgecapError:
        raise
    except Exception as exc:
        raise EdgecapError(f"int8 quantization of {name} failed: {str(exc).splitlines()[0][:200]}") from exc
    finally:
        logging.getLogger().setLevel(level)


def is_convolutional(path: Path) -> bool:
    """A front end whose work is convolutions (a CNN: resnet50, RN50, mobilenet, the demo's):
    more Conv nodes than linear layers. A ViT has one Conv (its patch embedding) and its linear
    layers are dynamic int8's."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return sum(n.op_type == "Conv" for n in graph.node) > len(_linear_nodes(graph))


def quantize_front_end(src: Path, dst: Path, images: list[np.ndarray]) -> str:
    """A convolutional front end as static QDQ int8, written to `dst`; -> "int8".

    Weights int8 with one symmetric scale per output channel; activations uint8 with a zero
    point, their ranges the min / max seen on `images` (preprocessed batches of the graph's
    static batch). uint8 x int8 is the pair onnxruntime's x86 kernels (AVX2, AVX-VNNI / AVX512-
    VNNI) multiply fastest: int8 x int8 QDQ ran resnet50 no faster than fp32 on this project's
    2-core Xeon, uint8 x int8 3x faster (benchmarks/README.md, "Static int8 front ends"). Every
    op onnxruntime can quantize is, so the residual adds and pooling stay in int8 between convs.
    Not TensorRT's form (its parser takes zero points of 0 only): `--engine trt` builds from
    symmetric QDQ (`quantize_int8(mode="static")`)."""
    require("onnxruntime.quantization", "train", "int8 quantization")
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    name = _input_names(src)[0]
    original, src = src, _prepared(src, dst, unfold_gemm=False)
    try:
        with _quantizer_errors(original.name):
            quantize_static(str(src), str(dst), _Feeds([{name: x} for x in images], [name]),
                            quant_format=QuantFormat.QDQ, per_channel=True, calibrate_method=CalibrationMethod.MinMax,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
    finally:
        if src != original:
            src.unlink(missing_ok=True)
    return "int8"


@dataclass(frozen=True)
class WeightOnly:
    """A weight-only quantization of the linear layers as onnxruntime's `com.microsoft.MatMulNBits`:
    weights in `bits` (8 or 4) with one symmetric scale per block of `block_size` input rows of
    each output column (onnxruntime quantizes blocks of 16 to 256 rows, so a 512-wide layer
    cannot have one scale per column), the activations left in fp32; `accuracy_level` 4 lets
    the CPU kernel quantize the activations to int8 per block inside the kernel, 0 computes in
    fp32 from the dequantized weights."""

    bits: int = 8
    block_size: int = 256
    accuracy_level: int = 4

    @property
    def name(self) -> str:
        return f"w{self.bits}-b{self.block_size}-a{self.accuracy_level}"


# `--quantize weight-only`: 8 bits, blocks of 256 input rows, int8 compute (benchmarks/README.md)
WEIGHT_ONLY = WeightOnly()


def quantize_weight_only(src: Path, dst: Path, scheme: WeightOnly = WEIGHT_ONLY) -> str:
    """Write `src` with its linear layers as MatMulNBits to `dst`; -> the precision written
    ("int8", "int4", or "fp32" for a graph without linear layers)."""
    onnx = require("onnx", "train", "weight-only quantization")
    require("onnxruntime.quantization", "train", "weight-only quantization")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(src))
    gemm_as_matmul(model)
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"{node.op_type}_{i}"  # the quantizer selects nodes by name
    linear = set(_linear_nodes(model.graph))
    if not linear:
        if src != dst:
            dst.write_bytes(src.read_bytes())
        return "fp32"
    del model.graph.value_info[:]
    # it takes every MatMul with a constant weight unless excluded: keep the attention operands
    # (memory slots' per-head K/V) in fp32, as dynamic int8 does
    others = sorted(n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in linear)
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer logs every node at INFO
    try:
        quantizer = MatMulNBitsQuantizer(model, bits=scheme.bits, block_size=scheme.block_size, is_symmetric=True,
                                         accuracy_level=scheme.accuracy_level, nodes_to_exclude=others)
        quantizer.process()
    except Exception as exc:  # MLAS reports an unsupported block size as a RuntimeError with its source path
        reason = str(exc).splitlines()[0].rsplit(" was false. ", 1)[-1][:200]
        raise EdgecapError(f"weight-only quantization ({scheme.name}) of {src.name} failed: {reason}") from exc
    finally:
        logging.getLogger().setLevel(level)
    onnx.save(quantizer.model.model, str(dst))
    return f"int{scheme.bits}"


def graph_mode(mode: str, role: str) -> str:
    """The quantization graph `role` gets under `--quantize mode`. Weight-only is for the decoder
    step, which runs on batch x beam rows (one for greedy batch 1), where MatMulNBits reads its
    weights fastest; the encoder and a front end run on every region or patch at once, where
    dynamic int8's integer GEMM is faster (both measured in benchmarks/README.md)."""
    return "dynamic" if mode == "weight-only" and role != "decoder_step" else mode


# kept fp32 in an fp16 graph: a LayerNorm's variance over a ViT-L's 1024 residual channels, some
# of them outliers, overflows fp16's 65504; TensorRT builds its fp16 engines from this graph
FP32_OPS = ("LayerNormalization", "GroupNormalization", "InstanceNormalization")


def convert_fp16(src: Path, dst: Path) -> str:
    """The graph in fp16, its inputs and outputs and every normalisation op kept fp32.

    Everything here is onnxruntime's own tooling over onnx protos (its fp16 converter and the
    topological sort of its transformer optimiser), so the conversion works with whichever onnx
    the machine has: an earlier version went through onnx-ir, whose reader failed on a GPU
    machine's onnx 1.23 (`SerdeError` on the M² step graph, benchmarks/README.md)."""
    require("onnx", "train", "fp16 conversion")
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    converted = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True,
                                         op_block_list=[*DEFAULT_OP_BLOCK_LIST, *FP32_OPS])
    # The converter appends its Casts at the end of the node list, which the ONNX spec (and
    # onnx.checker) refuses, and leaves value_info that disagrees with the casts around the ops
    # it kept fp32: nodes sorted, the stale type hints dropped (shape inference rebuilds them).
    OnnxModel(converted).topological_sort()
    del converted.graph.value_info[:]
    onnx.save(converted, str(dst))
    return "fp16"
