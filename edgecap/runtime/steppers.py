"""The bundle's decoder step as a `Stepper` for contract.beam, with its state in one of two places.

Both run `beam` of the graph's beam_size rows per image: search row i * beam + j runs on graph row
i * beam_size + j, and the graph's other rows are never read. Both allocate and bind every buffer
once, and keep it across frames (`reset` starts a new batch of images in the same buffers).

`HostStepper`: the cache in host memory, the graph reading it where it lies (onnxruntime's CPU
provider binds numpy arrays zero-copy). After a step the runtime writes the step's new slots
into slot t of its cache; `reorder` moves, for the rows whose beam changed, only the t + 1
filled slots. The CPU path: the cheapest there is on a CPU, since nothing moves that did not change.

`DeviceStepper`: the whole decoding state in the memory the graphs run in (a GPU's; the CPU
provider's too, which is how CI runs it): token, step, parent rows, two copies of the cache, the
cross tensors and every output are tensors allocated once and bound once. Per step the host
writes the token ids (and the step index and parent rows: a few bytes) and reads only the top-k
values and ids of every row. The bundle's `cache_update` graph (DecodingState.update) writes
the step's new slots and reorders the beams where the cache lives: it reads one copy of the
cache and writes the other, the two copies taking turns (ping-pong), so no binding ever changes
and every bound run can be captured once as a CUDA graph and replayed.
"""

from __future__ import annotations

import numpy as np

from edgecap.contract.beam import row_top_k
from edgecap.contract.state import CACHE_NEXT_SUFFIX, CACHE_OUT_SUFFIX
from edgecap.errors import EdgecapError


def search_rows(images: int, per_image: int, beam: int) -> np.ndarray:
    """Search row i * beam + j -> its graph row i * per_image + j."""
    return (np.arange(images)[:, None] * per_image + np.arange(beam)[None, :]).reshape(-1)


class _CacheGroup:
    """Cache tensors of one shape, dtype and slot axis (e.g. every layer's keys), stacked in one
    array whose slices the graph reads and writes, so writing a step's new slots and reordering
    beams are one numpy call for the whole group."""

    def __init__(self, shape, new_shape, dtype, axis, batch_axis: int, count: int):
        self.cache = np.zeros((count, *shape), dtype)
        self.new = np.zeros((count, *new_shape), dtype)
        self.axis = axis  # of the T slots in one tensor; None: the output is the whole tensor
        self.batch_axis = batch_axis

    def _slots(self, stop: int, start: int = 0):
        return self.cache[(slice(None),) * (self.axis + 1) + (slice(start, stop),)]

    def write(self, t: int) -> None:
        np.copyto(self.cache if self.axis is None else self._slots(t + 1, t), self.new)

    def move(self, src: np.ndarray, dst: np.ndarray, filled: int) -> None:
        part = self.cache if self.axis is None else self._slots(filled)
        view = np.moveaxis(part, self.batch_axis + 1, 1)
        view[:, dst] = view[:, src]  # the right side is gathered first, so rows may swap


class HostStepper:
    """The step graph over a cache in host memory (see the module doc). Its parts, each a
    method benchmarks can time: `run` (the graph), `write` (new slots into the cache),
    `reorder` (rows whose beam changed)."""

    def __init__(self, bundle, cross: tuple[np.ndarray, ...], beam: int):
        state = bundle.manifest.state
        graph = bundle._graphs["decoder_step"]
        entry = graph.entry
        images, per_image = bundle.batch_size, bundle.beam_size
        self.rows = search_rows(images, per_image, beam)
        self.identity = beam == per_image
        ins, outs = {t.name: t for t in entry.inputs}, {t.name: t for t in entry.outputs}
        self.token = np.zeros(images * per_image, np.int64)
        self.step = np.zeros((), np.int64)
        # the exporter drops inputs a graph never reads (an LSTM's step); those get no buffer
        self.cross_names = state.cross_graph_names
        self.cross = {n: np.zeros(ins[n].shape, np.dtype(ins[n].dtype)) for n in self.cross_names if n in ins}
        bound: dict[str, np.ndarray] = {}
        members: dict[tuple, list[tuple[str, str]]] = {}
        for tensor in state.graph_tensors("cache"):
            name, out = tensor.name, tensor.name + CACHE_OUT_SUFFIX
            if name in ins:
                key = (tuple(ins[name].shape), tuple(outs[out].shape), ins[name].dtype, tensor.slot_axis, tensor.batch_axis)
                members.setdefault(key, []).append((name, out))
        self.groups = []
        for (shape, new_shape, dtype, axis, batch_axis), names in members.items():
            group = _CacheGroup(shape, new_shape, np.dtype(dtype), axis, batch_axis, len(names))
            for i, (name, out) in enumerate(names):
                bound[name], bound[out] = group.cache[i], group.new[i]
            self.groups.append(group)
        self.outputs = [bound[t.name] if t.name in bound else np.zeros(t.shape, np.dtype(t.dtype)) for t in entry.outputs]
        out = dict(zip(outs, self.outputs, strict=True))
        self.logprobs = out["logprobs"]
        self.top = (out["top_logprobs"], out["top_tokens"]) if state.top_k else None
        inputs = {"token": self.token, "step": self.step, **self.cross, **{n: bound[n] for n in ins if n in bound}}
        self.run = graph.bind(inputs, self.outputs)
        self.filled = 0
        self.reset(cross)

    def reset(self, cross: tuple[np.ndarray, ...]) -> HostStepper:
        """Start a new batch of images in the same buffers (no allocation per frame)."""
        for name, value in zip(self.cross_names, cross, strict=True):
            if name in self.cross:
                np.copyto(self.cross[name], value)
        for group in self.groups:
            group.cache.fill(0)
        self.filled = 0
        return self

    def write(self, t: int) -> None:
        for group in self.groups:
            group.write(t)

    def _run(self, tokens: np.ndarray, t: int) -> None:
        self.token[self.rows] = tokens
        self.step[...] = t
        self.run()
        self.write(t)
        self.filled = t + 1

    def __call__(self, tokens: np.ndarray, t: int) -> np.ndarray:
        self._run(tokens, t)
        return self.logprobs if self.identity else self.logprobs[self.rows]

    def top_k(self, tokens: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.top is None:
            return row_top_k(self(tokens, t), k)
        self._run(tokens, t)
        values, ids = self.top
        return values[self.rows, :k], ids[self.rows, :k]

    def reorder(self, rows: np.ndarray) -> None:
        src, dst = self.rows[rows], self.rows
        moved = src != dst
        if not moved.any():
            return
        for group in self.groups:
            group.move(src[moved], dst[moved], self.filled)


class CrossTensors:
    """The cross tensors the decoder step reads, in the memory the graphs run in: one set per
    bundle, shared by the steppers of every beam size (they depend on the images only)."""

    def __init__(self, graph, names: list[str]):
        ins = {t.name: t for t in graph.entry.inputs}
        self.names = list(names)  # every cross tensor, in the encoder's output order
        self.tensors = {n: graph.tensor(ins[n].shape, ins[n].dtype) for n in names if n in ins}
        self.generation = 0  # counts the batches of images written

    def write(self, cross: tuple[np.ndarray, ...]) -> None:
        """numpy cross tensors (the encoder's outputs, in order) into the tensors."""
        if len(cross) != len(self.names):
            raise EdgecapError(f"{len(cross)} cross tensors given, the bundle's decoder takes {len(self.names)} "
                               f"({', '.join(self.names)})")
        for name, value in zip(self.names, cross, strict=True):
            if name in self.tensors:
                self.tensors[name].write(value)
        self.generation += 1

    def handle(self) -> DeviceCross:
        """What the encoder just left in the tensors, as `decode` takes it."""
        self.generation += 1
        return DeviceCross(self, self.generation)


class DeviceCross:
    """The encoder's outputs left where the decoder step reads them (the bundle's
    `CrossTensors`), as `Bundle.encode_for_decoding` returns them on the device path. Valid
    until the bundle's cross tensors are written again: `check` refuses a stale one."""

    def __init__(self, owner: CrossTensors, generation: int):
        self.owner, self.generation = owner, generation

    def check(self) -> None:
        if self.generation != self.owner.generation:
            raise EdgecapError("these cross tensors were overwritten by a later encode: decode each batch "
                               "before encoding the next (a Bundle holds one batch of cross tensors on the device)")


class DeviceStepper:
    """The step graph and the `cache_update` graph over state that stays where they run (see
    the module doc). Its parts, each a method benchmarks can time: `run` (the step graph),
    `write` (the cache_update graph: the previous step's slots written and the beams reordered,
    run at the start of the next step), `reorder` (only notes the parent rows), `read_top` (the
    one copy back per step)."""

    def __init__(self, bundle, cross: CrossTensors, beam: int):
        state = bundle.manifest.state
        step_graph, update_graph = bundle._graphs["decoder_step"], bundle._graphs["cache_update"]
        images, per_image = bundle.batch_size, bundle.beam_size
        rows = images * per_image
        self.rows = search_rows(images, per_image, beam)
        self.identity = beam == per_image
        self.all_rows = np.arange(rows, dtype=np.int64)
        outs = {t.name: t for t in step_graph.entry.outputs}
        ins = {t.name: t for t in step_graph.entry.inputs}
        tensor = step_graph.tensor
        self.token_ids = np.zeros(rows, np.int64)
        self.parents = self.all_rows.copy()
        self.token, self.step, self.parent = tensor([rows], np.int64), tensor([], np.int64), tensor([rows], np.int64)
        names = [n for n in state.cache_graph_names if n in ins]
        # two copies of the cache: a step reads `sides[s]`, the update writes `sides[1 - s]`
        self.sides = [{n: tensor(ins[n].shape, ins[n].dtype) for n in names} for _ in range(2)]
        new = {n + CACHE_OUT_SUFFIX: tensor(outs[n + CACHE_OUT_SUFFIX].shape, outs[n + CACHE_OUT_SUFFIX].dtype)
               for n in names}
        outputs = {n: new[n] if n in new else tensor(t.shape, t.dtype) for n, t in outs.items()}
        self.logprobs = outputs["logprobs"]
        self.top = (outputs["top_logprobs"], outputs["top_tokens"]) if state.top_k else None
        self.cross = cross
        common = {"token": self.token, "step": self.step, "parent": self.parent, **new, **cross.tensors}
        self._steps, self._updates = [], []
        for s in (0, 1):
            self._steps.append(step_graph.bind_tensors(_listed(step_graph, {**common, **self.sides[s]}), outputs,
                                                       capture=True))
            nxt = {n + CACHE_NEXT_SUFFIX: t for n, t in self.sides[1 - s].items()}
            self._updates.append(update_graph.bind_tensors(_listed(update_graph, {**common, **self.sides[s]}), nxt,
                                                           capture=True))
        self.side = 0
        self.pending = False  # a step ran whose slots the update has not written yet

    def reset(self, cross: tuple[np.ndarray, ...] | DeviceCross) -> DeviceStepper:
        """Start a new batch of images: the cache copy the first step reads zeroed (the update
        writes the other whole), and numpy cross tensors written to the device (a
        `DeviceCross` is already there)."""
        if isinstance(cross, DeviceCross):
            if cross.owner is not self.cross:
                raise EdgecapError("these cross tensors belong to another bundle")
            cross.check()
        else:
            self.cross.write(cross)
        for tensor in self.sides[0].values():
            tensor.zero()
        self.side, self.pending = 0, False
        self.parents[:] = self.all_rows
        return self

    def run(self) -> None:
        self._steps[self.side]()

    def write(self) -> None:
        """The previous step's slots into the other cache copy, rows gathered by their parents."""
        self.parent.write(self.parents)
        self._updates[self.side]()
        self.side = 1 - self.side
        self.parents[:] = self.all_rows
        self.pending = False

    def _run(self, tokens: np.ndarray, t: int) -> None:
        if self.pending:  # reads `step` while it still holds the previous step's index
            self.write()
        self.token_ids[self.rows] = tokens
        self.token.write(self.token_ids)
        self.step.write(np.asarray(t, np.int64))
        self.run()
        self.pending = True

    def read_top(self) -> tuple[np.ndarray, np.ndarray]:
        values, ids = self.top
        return values.read(), ids.read()

    def __call__(self, tokens: np.ndarray, t: int) -> np.ndarray:
        self._run(tokens, t)
        logprobs = self.logprobs.read()
        return logprobs if self.identity else logprobs[self.rows]

    def top_k(self, tokens: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.top is None:
            return row_top_k(self(tokens, t), k)
        self._run(tokens, t)
        values, ids = self.read_top()
        return values[self.rows, :k], ids[self.rows, :k]

    def reorder(self, rows: np.ndarray) -> None:
        self.parents[self.rows] = self.rows[rows]


def _listed(graph, pool: dict) -> dict:
    """The tensors of `pool` the graph takes (the exporter drops inputs a graph never reads)."""
    return {t.name: pool[t.name] for t in graph.entry.inputs if t.name in pool}
