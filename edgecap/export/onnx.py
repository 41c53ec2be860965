"""Write one GraphSpec as a static-shape ONNX file and describe its inputs and outputs.

The TorchScript exporter is the default: on these graphs it produces the same static graph as
the dynamo exporter about 20x faster (0.3 s against 5-9 s for a tiny model), which keeps export
and its tests quick; `exporter="dynamo"` uses `torch.onnx.export(..., dynamo=True)`. Either
way the graph then goes through onnxscript's optimizer (constant folding, Identity removal),
`onnx.checker`, and the static-graph checks of `compat.py`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import torch

from edgecap.errors import EdgecapError, require
from edgecap.export.specs.base import GraphSpec

ONNX_DTYPES = {1: "float32", 10: "float16", 7: "int64", 6: "int32", 9: "bool", 3: "int8", 2: "uint8"}


def tensor_specs(values) -> list[dict]:
    """ONNX ValueInfos -> [{"name", "shape", "dtype"}]; a symbolic or unknown dim raises."""
    out = []
    for v in values:
        t = v.type.tensor_type
        dtype = ONNX_DTYPES.get(t.elem_type)
        if dtype is None:
            raise EdgecapError(f"tensor {v.name!r} has ONNX element type {t.elem_type}, which bundles do not carry")
        shape = []
        for d in t.shape.dim:
            if not d.HasField("dim_value"):
                raise EdgecapError(f"tensor {v.name!r} has a dynamic dimension {d.dim_param!r}; bundles are static")
            shape.append(int(d.dim_value))
        out.append({"name": v.name, "shape": shape, "dtype": dtype})
    return out


def _torch_export(spec: GraphSpec, path: Path, opset: int, exporter: str) -> None:
    kwargs = dict(input_names=spec.input_names, output_names=spec.output_names, opset_version=opset)
    noise = io.StringIO()
    # nn.MultiheadAttention (open_clip's ViT blocks) takes a fused fast path in eval mode under
    # no_grad, `aten::_native_multi_head_attention`, which no ONNX exporter can write; off, it
    # runs as the plain matmul / softmax ops it is made of.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(noise), torch.no_grad():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                require("onnxscript", "train", "the dynamo ONNX exporter")
                torch.onnx.export(spec.module, spec.dummy_inputs, str(path), dynamo=True, external_data=False,
                                  **kwargs)
            else:
                torch.onnx.export(spec.module, spec.dummy_inputs, str(path), dynamo=False,
                                  do_constant_folding=True, **kwargs)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    # the TorchScript exporter puts a module back in training mode after tracing it
    spec.module.eval()


class _SkipGraphIOInitializerNotice(logging.Filter):
    """onnx_ir's initializer deduplication warns, on every export, that it leaves alone an
    initializer that is also a graph input (our static masks): expected, and nothing to act on.
    Its other warnings (an initializer without a value) still get through."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "as it is a graph input or output" not in str(record.msg)


_DEDUP_LOGGER = "onnx_ir.passes.common.initializer_deduplication"


def optimize(model):
    """Fold constants and drop Identity nodes; keeps names of graph inputs and outputs."""
    try:
        from onnxscript import optimizer
    except ImportError:  # the graph is valid without it, only larger
        return model
    logger, quiet = logging.getLogger(_DEDUP_LOGGER), _SkipGraphIOInitializerNotice()
    logger.addFilter(quiet)
    try:
        return optimizer.optimize(model)
    finally:
        logger.removeFilter(quiet)


# ops that compute shapes; small constant results of these are folded into initialisers
_SHAPE_OPS = {"ConstantOfShape", "Equal", "Where", "Mul", "Add", "Sub", "Div", "Concat", "Unsqueeze",
              "Squeeze", "Gather", "Shape", "Cast", "Slice", "Range", "Not", "Less", "LessOrEqual",
              "Greater", "GreaterOrEqual", "Reshape", "Identity"}
_FOLD_LIMIT = 4096  # elements: shape vectors and masks, never weights (Expand is never folded)


def fold_shape_constants(model):
    """Evaluate small shape computations on constants (the TorchScript exporter's pattern for
    `expand(batch, -1, ...)`), so shape inference sees every tensor's static shape."""
    import onnx
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    known = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    keep, added = [], []
    for node in graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            ref = ReferenceEvaluator(onnx.helper.make_model(onnx.helper.make_graph(
                [node], "c", [], [onnx.helper.make_empty_tensor_value_info(node.output[0])]), opset_imports=model.opset_import))
            known[node.output[0]] = ref.run(None, {})[0]
            added.append(node.output[0])
            continue
        if node.op_type in _SHAPE_OPS and node.domain in ("", "ai.onnx") and all(i in known for i in node.input if i):
            sub = onnx.helper.make_model(
                onnx.helper.make_graph([node], "fold", [], [onnx.helper.make_empty_tensor_value_info(o) for o in node.output],
                                       initializer=[numpy_helper.from_array(known[i], i) for i in node.input if i]),
                opset_imports=model.opset_import)
            try:
                values = ReferenceEvaluator(sub).run(None, {})
            except Exception:  # leave anything the reference evaluator cannot run to the runtime
                keep.append(node)
                continue
            if all(getattr(v, "size", 0) <= _FOLD_LIMIT for v in values):
                for name, value in zip(node.output, values, strict=False):
                    known[name] = value
                    added.append(name)
                continue
        keep.append(node)
    if not added:
        return model
    outputs = {o.name for o in graph.output}
    used = {i for n in keep for i in n.input} | outputs
    del graph.node[:]
    graph.node.extend(keep)
    existing = {i.name for i in graph.initializer}
    for name in added:
        if name in used and name not in existing:
            graph.initializer.append(numpy_helper.from_array(known[name], name))
    return model


def export_graph(spec: GraphSpec, path: str | Path, opset: int, exporter: str = "torchscript") -> dict:
    """Export, optimise, check and save; -> {"inputs": [...], "outputs": [...], "opset": n}."""
    onnx = require("onnx", "train", "ONNX export")
    path = Path(path)
    try:
        _torch_export(spec, path, opset, exporter)
    except (EdgecapError, OSError):  # an OSError is about the file: the bundle's writer names it (a full disk)
        raise
    except Exception as exc:  # the exporters raise many types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgecapError(f"exporting the {spec.role} graph to ONNX failed: {first[:300]}") from exc
    model = optimize(fold_shape_constants(optimize(onnx.load(str(path)))))
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        raise EdgecapError(f"{path.name}: onnx.checker rejects the exported graph: {str(exc).splitlines()[0][:300]}") from exc
    onnx.save(model, str(path))

    inputs = tensor_specs(model.graph.input)
    outputs = tensor_specs(model.graph.output)
    names = [t["name"] for t in inputs]
    dropped = [n for n in spec.input_names if n not in names]
    unexpected = [n for n in dropped if n not in spec.unused_inputs]
    if unexpected:
        raise EdgecapError(f"{path.name}: the exporter dropped inputs {unexpected}, which the model should read")
    if [t["name"] for t in outputs] != spec.output_names:
        raise EdgecapError(f"{path.name}: outputs {[t['name'] for t in outputs]}, expected {spec.output_names}")
    return {"inputs": inputs, "outputs": outputs, "opset": _opset_of(model)}


def _opset_of(model) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
