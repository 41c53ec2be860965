"""TensorRT compatibility checks on every exported ONNX graph, before a TensorRT build and in the tests.

The judge is the real TensorRT ONNX parser whenever TensorRT or TensorRT for RTX imports
(`export.tensorrt.parser_problems`: its errors in its own words; TensorRT for RTX's parser runs
without a GPU, so CI has it): `check_file` records which parser ruled in the report. Always, for
the bundle's own contract (one static engine per graph):
- every graph input, output and (after shape inference) intermediate tensor has a static shape;
- no control flow (If, Loop, Scan) and no op whose output shape depends on data (NonZero, ...).
Only when neither TensorRT imports, the fallback is edgecap's own list of what TensorRT's
parser takes, checked statically:
- every op is one the TensorRT ONNX parser implements in every supported release (the list
  below: onnx-tensorrt's docs/operators.md for TensorRT 10.0, the oldest supported; 10.15 and
  11 add ops such as Attention and RMSNormalization that 10.0-10.3, JetPack 6's, cannot parse);
- the default-domain opset is one TensorRT 10.0 parses (9-20);
- quantization is TensorRT's: Quantize/DequantizeLinear with int8 values and all-zero zero
  points (the parser refuses others), no onnxruntime integer ops (MatMulInteger,
  DynamicQuantizeLinear, ...: dynamic int8);
- only dtypes TensorRT carries (no float64, strings, complex);
- no onnxruntime contrib ops (domain com.microsoft, e.g. the MatMulNBits of weight-only int8):
  the TensorRT ONNX parser implements the standard domain only, and ONNX shape inference
  cannot see through them, so their graphs' shapes are not checked further;
And polygraphy loads the graph and runs it with onnxruntime on inputs generated from the
graph's own metadata, which confirms the shapes it reports are the ones the bundle records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgecap.errors import EdgecapError, require
from edgecap.runtime import tensorrt_dist

# TensorRT parses If / Loop / Scan, but an exported captioning graph is straight-line by design
CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}
DATA_DEPENDENT = {"NonZero", "Unique", "NonMaxSuppression", "Compress", "StringNormalizer", "Multinomial"}

# ONNX ops the TensorRT 10.0 ONNX parser supports (onnx-tensorrt docs/operators.md of 10.0;
# every one is still supported in 10.15), less control flow, data-dependent shapes and the
# random generators (a seeded parity gate cannot hold for them)
TENSORRT_OPS = {
    "CastLike", "GRU", "GlobalLpPool", "GridSample", "Hardmax", "ImageScaler", "LSTM", "LpNormalization",
    "LpPool", "MeanVarianceNormalization", "Mish", "ReverseSequence", "RoiAlign", "ScaledTanh", "Scatter",
    "Upsample",
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh",
    "AveragePool", "BatchNormalization", "Cast", "Ceil", "Celu", "Clip", "Concat", "Constant",
    "ConstantOfShape", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "DequantizeLinear",
    "DepthToSpace", "Div", "Dropout", "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "EyeLike",
    "Flatten", "Floor", "Gather", "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool",
    "GlobalMaxPool", "Greater", "GreaterOrEqual", "GroupNormalization", "HardSigmoid", "HardSwish",
    "Identity", "InstanceNormalization", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu",
    "Less", "LessOrEqual", "Log", "LogSoftmax", "LRN", "MatMul", "Max", "MaxPool", "Mean", "Min",
    "Mod", "Mul", "Neg", "Not", "OneHot", "Or", "Pad", "ParametricSoftplus", "Pow", "PRelu",
    "QuantizeLinear", "Range", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
    "ReduceSumSquare", "Relu", "Reshape", "Resize", "Round", "ScatterElements", "ScatterND",
    "Selu", "Shape", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Size", "Slice", "Softmax",
    "Softplus", "Softsign", "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tan",
    "Tanh", "ThresholdedRelu", "Tile", "TopK", "Transpose", "Trilu", "Unsqueeze", "Where", "Xor",
}
CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_HINTS = {f"{CONTRIB_DOMAIN}::MatMulNBits": " (weight-only int8: --quantize weight-only)"}
# onnxruntime's integer ops, which TensorRT does not parse: it builds int8 from Q/DQ pairs
INTEGER_OP_HINT = (" (onnxruntime's dynamic int8; TensorRT builds int8 from QDQ graphs: "
                   "--engine trt --precision int8)")
INTEGER_OPS = {"MatMulInteger", "DynamicQuantizeLinear", "ConvInteger", "QLinearMatMul", "QLinearConv"}
OPSETS = (9, 20)  # the default-domain opsets TensorRT 10.0's parser reads (10.15: 9-24)
QDQ_OPS = {"QuantizeLinear": 2, "DequantizeLinear": 2}  # op -> the zero point's input index
# TensorRT 10 carries these element types (int64 natively since 10.0)
TENSORRT_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 7: "int64", 6: "int32", 9: "bool", 3: "int8", 2: "uint8"}


FALLBACK = "edgecap's list of TensorRT 10.0's ONNX ops (no TensorRT installed)"


@dataclass
class CompatReport:
    file: str
    ops: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    polygraphy: dict = field(default_factory=dict)
    checked_by: str = FALLBACK  # which parser (or edgecap's list) judged the graph

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"file": self.file, "ok": self.ok, "ops": self.ops, "problems": self.problems,
                "polygraphy": self.polygraphy, "checked_by": self.checked_by}


def _walk_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:  # subgraphs of control-flow nodes
            if attr.g is not None and attr.g.node:
                yield from _walk_nodes(attr.g)


def _qdq_problems(graph) -> list[str]:
    """TensorRT's explicit quantization is symmetric int8: a Q/DQ zero point must be an int8
    constant of zeros (onnxruntime's default static QDQ, asymmetric uint8, is refused)."""
    from onnx import TensorProto, numpy_helper

    constants = {i.name: i for i in graph.initializer}
    constants.update({n.output[0]: a.t for n in graph.node if n.op_type == "Constant"
                      for a in n.attribute if a.name == "value"})
    problems = []
    for node in graph.node:
        index = QDQ_OPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if index is None or len(node.input) <= index or not node.input[index]:
            continue
        zero = constants.get(node.input[index])
        if zero is None:
            problems.append(f"{node.op_type} {node.name!r}: zero point {node.input[index]!r} is not a constant")
        elif zero.data_type != TensorProto.INT8:
            problems.append(f"{node.op_type} {node.name!r}: zero point is {TensorProto.DataType.Name(zero.data_type)}, "
                            "TensorRT quantizes to INT8 only")
        elif numpy_helper.to_array(zero).any():
            problems.append(f"{node.op_type} {node.name!r}: non-zero zero point (asymmetric quantization; "
                            "TensorRT needs symmetric)")
    return problems[:3] + ([f"... {len(problems) - 3} more Q/DQ nodes like these"] if len(problems) > 3 else [])


def check_graph(model, name: str = "graph", op_list: bool = True) -> CompatReport:
    """Static checks on an onnx.ModelProto: the bundle's contract (static shapes, straight-line),
    and with `op_list` edgecap's own list of what TensorRT's parser takes (the fallback)."""
    onnx = require("onnx", "train", "ONNX compatibility checks")
    report = CompatReport(file=name)
    ops = set()
    for node in _walk_nodes(model.graph):
        ops.add(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}")
    report.ops = sorted(ops)
    for op in sorted(ops & CONTROL_FLOW):
        report.problems.append(f"control flow op {op} (exported graphs are straight-line: one static engine each)")
    for op in sorted(ops & DATA_DEPENDENT):
        report.problems.append(f"op {op} has a data-dependent output shape")
    contrib = sorted(op for op in ops if op.startswith(f"{CONTRIB_DOMAIN}::"))
    if not op_list:
        return report if contrib else _shape_problems(onnx, model, report, dtypes=False)
    for op in contrib:
        report.problems.append(f"op {op} is an onnxruntime contrib op{CONTRIB_HINTS.get(op, '')} "
                               "that the TensorRT ONNX parser does not implement")
    for op in sorted(ops - TENSORRT_OPS - CONTROL_FLOW - DATA_DEPENDENT - set(contrib)):
        hint = INTEGER_OP_HINT if op in INTEGER_OPS else ""
        report.problems.append(f"op {op} is not supported by the TensorRT ONNX parser{hint}")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and not OPSETS[0] <= opset <= OPSETS[1]:
        report.problems.append(f"opset {opset}: TensorRT 10.0's ONNX parser reads opsets {OPSETS[0]}-{OPSETS[1]}")
    report.problems += _qdq_problems(model.graph)
    if contrib:
        return report  # shape inference stops at ops it does not know: every later shape looks dynamic
    return _shape_problems(onnx, model, report, dtypes=True)


def _shape_problems(onnx, model, report: CompatReport, dtypes: bool) -> CompatReport:
    """Every tensor's shape static after ONNX shape inference; with `dtypes`, every element
    type one TensorRT carries (edgecap's list)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:  # an invalid graph is a finding, not a crash
        report.problems.append(f"ONNX shape inference fails: {str(exc).strip().splitlines()[0][:200]}")
        return report
    g = inferred.graph
    initialisers = {i.name for i in g.initializer}
    for kind, values in (("input", g.input), ("output", g.output), ("tensor", g.value_info)):
        for v in values:
            if v.name in initialisers:
                continue
            t = v.type.tensor_type
            if not v.type.HasField("tensor_type"):
                report.problems.append(f"{kind} {v.name!r} is not a tensor")
                continue
            if dtypes and t.elem_type not in TENSORRT_DTYPES:
                report.problems.append(f"{kind} {v.name!r} has element type {t.elem_type} (not carried by TensorRT)")
            if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
                dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim] if t.HasField("shape") else "unknown rank"
                report.problems.append(f"{kind} {v.name!r} has a non-static shape {dims}")
    for init in g.initializer if dtypes else ():
        if init.data_type not in TENSORRT_DTYPES:
            report.problems.append(f"initializer {init.name!r} has element type {init.data_type}")
    return report


def polygraphy_inspect(path: str | Path, value_ranges: dict[str, tuple] | None = None) -> dict:
    """Load with polygraphy, read its input metadata, run once on onnxruntime -> a summary."""
    require("polygraphy", "trt", "polygraphy inspection")
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import DataLoader
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR
    runner = OnnxrtRunner(SessionFromOnnx(str(path), providers=["CPUExecutionProvider"]))
    with runner:
        meta = runner.get_input_metadata(use_numpy_dtypes=False)
        ranges = {k: v for k, v in (value_ranges or {}).items() if k in meta}
        loader = DataLoader(val_range=ranges, iterations=1, seed=0)
        loader.input_metadata = meta
        outputs = runner.infer(next(iter(loader)))
        inputs = {name: {"shape": list(m.shape), "dtype": str(m.dtype).lower()} for name, m in meta.items()}
        outs = {name: list(value.shape) for name, value in outputs.items()}
    dynamic = [n for n, m in inputs.items() if any(not isinstance(d, int) or d < 0 for d in m["shape"])]
    return {"inputs": inputs, "outputs": outs, "dynamic_inputs": dynamic, "ran": True}


def check_file(path: str | Path, value_ranges: dict[str, tuple] | None = None, run_polygraphy: bool = True,
               tensorrt: str = "auto") -> CompatReport:
    """The checks on one graph file. tensorrt: the distribution whose parser judges it ("auto":
    TensorRT, else TensorRT for RTX, else edgecap's list when neither imports)."""
    onnx = require("onnx", "train", "ONNX compatibility checks")
    path = Path(path)
    dist = tensorrt_dist.available() if tensorrt == "auto" else tensorrt_dist.DISTRIBUTIONS[tensorrt]
    report = check_graph(onnx.load(str(path), load_external_data=False), path.name, op_list=dist is None)
    if dist is not None:
        from edgecap.export.tensorrt import parser_problems

        module = tensorrt_dist.load(dist, "TensorRT compatibility checks")
        report.problems += parser_problems(path, dist)
        report.checked_by = f"{dist.describe(module.__version__)}'s ONNX parser"
    if run_polygraphy:
        try:
            report.polygraphy = polygraphy_inspect(path, value_ranges)
        except EdgecapError:
            raise
        except Exception as exc:  # polygraphy / onnxruntime failures are findings, not crashes
            report.problems.append(f"polygraphy could not run the graph with onnxruntime: {str(exc).splitlines()[0][:200]}")
        else:
            for name in report.polygraphy["dynamic_inputs"]:
                report.problems.append(f"polygraphy reports input {name!r} as dynamic")
    return report


def require_compatible(reports: list[CompatReport]) -> None:
    bad = [r for r in reports if not r.ok]
    if bad:
        r = bad[0]
        more = f" (and {len(bad) - 1} more graphs)" if len(bad) > 1 else ""
        raise EdgecapError(f"{r.file} is not TensorRT-compatible: {'; '.join(r.problems[:3])}{more}")
