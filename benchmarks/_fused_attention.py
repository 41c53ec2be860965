"""Attention subgraphs of an exported graph rewritten as onnxruntime's fused CPU kernel.

The exported graphs spell attention out as ~20 small nodes per block (reshape, transpose,
matmul, scale, mask, softmax, slice, add), which onnxruntime's own fusions do not recognise:
the static transposed cache, the step's two-block softmax and the rows grouped per image
match none of its patterns. Each costs a few microseconds whatever the row count. This pass
finds them by structure and replaces each with one `com.microsoft.MultiHeadAttention` node:

- decoding-step self-attention, Softmax(Concat(Where(~visible, -inf, Q Kc / s), Q k / s)) over
  the static cache and the position's own key: MHA with the cache as `past_key` / `past_value`
  (BNSH; the cache keys are stored transposed, so one Transpose per layer) and an additive
  `attention_bias` that hides the unwritten slots;
- attention over keys shared by groups of rows (cross-attention, M²'s meshed levels),
  Softmax(Where(~visible, -inf, Q K / s)) V: MHA with the K rows of an image as its query
  sequence and every level as a batch row.

Blocks with anything else in them (learned memory slots, PMA prototypes, ACF's bias) are left
as they are. Only onnxruntime runs com.microsoft ops: TensorRT builds from the plain graph.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

LAYOUT_OPS = ("Reshape", "Transpose")
MS_DOMAIN = "com.microsoft"
_MASKED = -1e9  # the score the plain graph writes for a hidden key (models' MASK_VALUE)


class _Graph:
    """Producer / consumer / shape lookups over an ONNX graph, and new nodes and constants."""

    def __init__(self, model):
        import onnx

        self.model = model
        self.graph = model.graph
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        self.shapes = {}
        for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
            dims = v.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims) and v.type.tensor_type.HasField("shape"):
                self.shapes[v.name] = [d.dim_value for d in dims]
        self.consts = {t.name: onnx.numpy_helper.to_array(t) for t in self.graph.initializer}
        for t in self.graph.initializer:
            self.shapes.setdefault(t.name, list(t.dims))
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in self.graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.added: list = []
        self.serial = Counter()

    def node(self, name: str, op: str, inputs: list[str], attrs: dict | None = None, outputs: int = 1,
             domain: str = "") -> list[str]:
        import onnx

        self.serial[name] += 1
        base = f"fused/{name}_{self.serial[name]}"
        outs = [f"{base}/out{i}" for i in range(outputs)]
        self.added.append(onnx.helper.make_node(op, inputs, outs, name=base, domain=domain, **(attrs or {})))
        return outs

    def const(self, name: str, value) -> str:
        import onnx

        self.serial[name] += 1
        full = f"fused/{name}_{self.serial[name]}"
        self.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value), full))
        return full

    def reshape(self, x: str, shape) -> str:
        return self.node("reshape", "Reshape", [x, self.const("shape", np.array(shape, np.int64))])[0]

    def only_consumer(self, name: str):
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 else None

    def op(self, name: str, op_type: str):
        n = self.producer.get(name)
        return n if n is not None and n.op_type == op_type and n.domain in ("", "ai.onnx") else None

    def layout_source(self, name: str) -> str:
        """Walk back through Reshape / Transpose to the tensor they re-lay-out."""
        while (n := self.producer.get(name)) is not None and n.op_type in LAYOUT_OPS:
            name = n.input[0]
        return name

    def layout_sink(self, name: str) -> str:
        """Walk forward through a chain of single-consumer Reshape / Transpose nodes."""
        while (n := self.only_consumer(name)) is not None and n.op_type in LAYOUT_OPS:
            name = n.output[0]
        return name

    def scalar(self, name: str) -> float | None:
        value = self.consts.get(name)
        return float(value) if value is not None and value.size == 1 else None


def _scaled_scores(g: _Graph, name: str):
    """Div(MatMul(q, k), c) -> (q, k, c) or None."""
    div = g.op(name, "Div")
    if div is None or g.scalar(div.input[1]) is None:
        return None
    mm = g.op(div.input[0], "MatMul")
    if mm is None:
        return None
    return mm.input[0], mm.input[1], g.scalar(div.input[1])


def _masked_scores(g: _Graph, name: str):
    """Where(hidden, -1e9, Div(MatMul(q, k), c)) -> (hidden, q, k, c) or None."""
    where = g.op(name, "Where")
    if where is None or g.scalar(where.input[1]) != _MASKED:
        return None
    scores = _scaled_scores(g, where.input[2])
    return None if scores is None else (where.input[0], *scores)


def _hidden_bias(g: _Graph, hidden: str) -> str:
    """bool `hidden` -> float additive bias: -1e9 where hidden, 0 elsewhere."""
    return g.node("bias", "Where", [hidden, g.const("masked", np.float32(_MASKED)), g.const("zero", np.float32(0))])[0]


def _mha(g: _Graph, heads: int, scale: float, dh: int, inputs: list[str], outputs: int = 1) -> list[str]:
    attrs = {"num_heads": heads}
    if not math.isclose(scale, math.sqrt(dh), rel_tol=1e-6):
        attrs["scale"] = 1.0 / scale
    return g.node("mha", "MultiHeadAttention", inputs, attrs, outputs=outputs, domain=MS_DOMAIN)


def _fuse_step_self(g: _Graph, softmax) -> str | None:
    """The decoding step's cache + own-position attention; -> the replaced output or None."""
    concat = g.op(softmax.input[0], "Concat")
    if concat is None or len(concat.input) != 2:
        return None
    cached, own = _masked_scores(g, concat.input[0]), _scaled_scores(g, concat.input[1])
    if cached is None or own is None:
        return None
    hidden, q, cache_k, scale = cached
    q2, new_k, scale2 = own
    if q2 != q or scale2 != scale:
        return None
    # the two value blocks: Add(MatMul(Slice(p), cache_v), MatMul(Slice(p), new_v))
    slices = g.consumers.get(softmax.output[0], [])
    if len(slices) != 2 or any(s.op_type != "Slice" for s in slices):
        return None
    value_mms = [g.only_consumer(s.output[0]) for s in slices]
    if any(m is None or m.op_type != "MatMul" for m in value_mms):
        return None
    add = g.only_consumer(value_mms[0].output[0])
    if add is None or add.op_type != "Add" or {*add.input} != {m.output[0] for m in value_mms}:
        return None
    starts = [g.consts.get(s.input[1]) for s in slices]
    if any(s is None for s in starts):
        return None
    cache_mm, own_mm = (value_mms if int(starts[0].ravel()[0]) == 0 else value_mms[::-1])
    cache_v, new_v = cache_mm.input[1], own_mm.input[1]
    shapes = [g.shapes.get(n) for n in (q, cache_k, cache_v, new_k, hidden)]
    if any(s is None for s in shapes):
        return None
    q_shape, k_shape, v_shape, _, hidden_shape = shapes
    if len(q_shape) != 4 or q_shape[2] != 1 or len(k_shape) != 4:
        return None
    rows, heads, _, dh = q_shape
    slots = k_shape[3]
    if k_shape != [rows, heads, dh, slots] or v_shape != [rows, heads, slots, dh]:
        return None
    if len(hidden_shape) != 4 or hidden_shape[2] != 1:
        return None
    query, key, value = (g.layout_source(n) for n in (q, new_k, new_v))
    if any(g.shapes.get(n) not in _step_rows(rows, heads * dh) for n in (query, key, value)):
        return None
    out = g.layout_sink(add.output[0])
    if g.shapes.get(out) not in _step_rows(rows, heads * dh):
        return None
    # the kernels take [batch, sequence, hidden]: a step on [rows, d] gets its sequence axis back
    query, key, value = (g.reshape(n, [rows, 1, heads * dh]) for n in (query, key, value))
    past_key = _bnsh_input(g, cache_k) if g.bnsh else g.node("past_key", "Transpose", [cache_k], {"perm": [0, 1, 3, 2]})[0]
    if g.self_kernel == "gqa":
        step = g.step_name
        seqlens = g.node("seqlens", "Cast", [g.node("rows", "Expand", [step, g.const("shape", np.array([rows], np.int64))])[0]], {"to": 6})[0]
        total = g.node("total", "Cast", [g.node("plus1", "Add", [step, g.const("one", np.int64(1))])[0]], {"to": 6})[0]
        attrs = {"num_heads": heads, "kv_num_heads": heads}
        if not math.isclose(scale, math.sqrt(dh), rel_tol=1e-6):
            attrs["scale"] = 1.0 / scale
        fused, pk, pv = g.node("gqa", "GroupQueryAttention", [query, key, value, past_key, cache_v, seqlens, total],
                               attrs, outputs=3, domain=MS_DOMAIN)
        node = g.added[-1]
        node.output[1], node.output[2] = f"{cache_k}.present", f"{cache_v}.present"
        g.presents += [(cache_k, [rows, heads, slots, dh]), (cache_v, [rows, heads, slots, dh])]
        return _rewire(g, out, g.reshape(fused, g.shapes[out]))
    bias = _hidden_bias(g, hidden)
    own_slot = g.const("own_slot", np.zeros(hidden_shape[:3] + [1], np.float32))
    bias = g.node("bias_cat", "Concat", [bias, own_slot], {"axis": -1})[0]
    fused, _, _ = _mha(g, heads, scale, dh, [query, key, value, "", "", bias, past_key, cache_v], outputs=3)
    return _rewire(g, out, g.reshape(fused, g.shapes[out]))


def _step_rows(rows: int, width: int) -> tuple[list[int], list[int]]:
    """The shapes a decoding step's rows may have: [R, 1, d] or [R, d] (edgecap's step)."""
    return [rows, 1, width], [rows, width]


def _bnsh_input(g: _Graph, name: str) -> str:
    """Redeclare graph input `name` [..., dh, L] as [..., L, dh] (the caller feeds that layout)."""
    for i in g.graph.input:
        if i.name == name:
            dims = i.type.tensor_type.shape.dim
            dims[-1].dim_value, dims[-2].dim_value = dims[-2].dim_value, dims[-1].dim_value
            return name
    raise ValueError(name)


def _fuse_shared_keys(g: _Graph, softmax) -> str | None:
    """Attention of grouped rows over keys they share (cross-attention); -> replaced output or None."""
    masked = _masked_scores(g, softmax.input[0])
    out_mm = g.only_consumer(softmax.output[0])
    if masked is None or out_mm is None or out_mm.op_type != "MatMul" or out_mm.input[0] != softmax.output[0]:
        return None
    hidden, q, keys, scale = masked
    values = out_mm.input[1]
    shapes = [g.shapes.get(n) for n in (q, keys, values, hidden)]
    if any(s is None for s in shapes):
        return None
    q_shape, k_shape, v_shape, hidden_shape = shapes
    if len(k_shape) < 4 or len(q_shape) != 4:
        return None
    *lead, images, heads, dh, length = k_shape
    group = q_shape[2]
    if q_shape != [images, heads, group, dh] or v_shape != [*lead, images, heads, length, dh]:
        return None
    rows = images * group
    query = g.layout_source(q)
    if g.shapes.get(query) not in _step_rows(rows, heads * dh):
        return None
    out = g.layout_sink(out_mm.output[0])
    levels = int(np.prod(lead)) if lead else 1
    if g.shapes.get(out) not in ([*lead, rows, 1, heads * dh], [*lead, rows, heads * dh], [levels * rows, heads * dh]):
        return None
    # hidden broadcasts to the scores [*lead, images, heads, group, length]; MHA wants a bias
    # [batch, 1, group, length] with batch = levels x images
    full = len(lead) + 4
    hidden_shape = [1] * (full - len(hidden_shape)) + hidden_shape
    if hidden_shape[-3] != 1 or hidden_shape[-1] != length:
        return None
    bias = _hidden_bias(g, hidden)
    bias = g.node("bias_expand", "Expand", [bias, g.const("shape", np.array([*lead, images, 1, group, length], np.int64))])[0]
    bias = g.reshape(bias, [levels * images, 1, group, length])
    query = g.reshape(query, [1, images, group, heads * dh])
    if levels > 1:
        query = g.node("levels", "Expand", [query, g.const("shape", np.array([levels, images, group, heads * dh], np.int64))])[0]
    query = g.reshape(query, [levels * images, group, heads * dh])
    perm = list(range(len(k_shape)))
    perm[-2:] = perm[-1], perm[-2]
    key = g.reshape(_bnsh_input(g, keys) if g.bnsh else g.node("key", "Transpose", [keys], {"perm": perm})[0],
                    [levels * images, heads, length, dh])
    value = g.reshape(values, [levels * images, heads, length, dh])
    fused = _mha(g, heads, scale, dh, [query, key, value, "", "", bias])[0]
    return _rewire(g, out, g.reshape(fused, g.shapes[out]))


def _rewire(g: _Graph, old: str, new: str) -> str:
    for users in g.consumers.get(old, []):
        for i, name in enumerate(users.input):
            if name == old:
                users.input[i] = new
    for o in g.graph.output:
        if o.name == old:  # an output keeps its name: rename the new tensor instead
            g.added.append(_identity(new, old))
    return old


def _identity(src: str, dst: str):
    import onnx

    return onnx.helper.make_node("Identity", [src], [dst], name=f"fused/{dst}")


def _prune(graph) -> None:
    """Drop nodes and initialisers nothing reachable from the outputs reads."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    unused = [t for t in graph.initializer if t.name not in needed]
    for t in unused:
        graph.initializer.remove(t)


def _toposort(graph) -> None:
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        rest = []
        for node in pending:
            if all(i in ready for i in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            missing = sorted({i for n in rest for i in n.input if i not in ready})[:5]
            raise ValueError(f"fused graph has a cycle or a missing input: {missing}")
        pending = rest
    del graph.node[:]
    graph.node.extend(ordered)


def fuse_attention(model, self_kernel: str = "mha", bnsh: bool = False) -> tuple[object, Counter]:
    """Rewrite `model` (an onnx ModelProto) in place; -> (model, count of blocks fused per kind)."""
    import onnx

    g = _Graph(model)
    g.self_kernel, g.bnsh, g.presents, g.step_name = self_kernel, bnsh, [], "step"
    fused = Counter()
    for softmax in [n for n in g.graph.node if n.op_type == "Softmax"]:
        for kind, rule in (("self_step", _fuse_step_self), ("shared_keys", _fuse_shared_keys)):
            if rule(g, softmax) is not None:
                fused[kind] += 1
                break
    if not fused:
        return model, fused
    for cache, shape in g.presents:
        g.graph.output.append(onnx.helper.make_tensor_value_info(f"{cache}.present", onnx.TensorProto.FLOAT, shape))
    g.graph.node.extend(g.added)
    _toposort(g.graph)
    _prune(g.graph)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
    del g.graph.value_info[:]
    return model, fused
