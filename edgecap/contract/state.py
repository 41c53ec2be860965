"""The decoding state a family carries, described once by name (torch-free).

A captioner's state is two groups of tensors:

    cross  what `encode` computes once per image (cross-attention keys/values, masks, ...)
    cache  what the decoder step reads and extends (self-attention keys/values, LSTM state, ...)

Each tensor is a `StateTensor`: its name, the axis of its batch (image rows for cross, search
rows for cache), the axis of its time slots (a cache tensor the step extends by one slot; None
for a tensor the step replaces whole or never writes) and whether it is per decoder layer.
Axes are those of ONE layer's tensor: the graph tensor `<name>.<layer>` the exporter writes and
the runtime binds. The PyTorch model stacks a per-layer tensor on a new axis 0, so its axes
are one higher there (`model_axis`).

The model declares a `StateDescription`, the exporter writes it into the manifest
(`to_dict`), and the runtime reads it back (`from_dict`): neither side keeps positional tuples
of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgecap.errors import EdgecapError

CACHE_OUT_SUFFIX = ".new"   # the step's output for a cache tensor: its new slot
CACHE_NEXT_SUFFIX = ".next"  # the cache_update graph's output: the tensor for the next step


@dataclass(frozen=True)
class StateTensor:
    name: str
    batch_axis: int
    slot_axis: int | None = None
    per_layer: bool = False

    def model_axis(self, axis: int | None) -> int | None:
        """An axis of one layer's tensor -> the same axis in the model's stacked tensor."""
        return None if axis is None else axis + int(self.per_layer)

    def graph_names(self, layers: int) -> list[str]:
        return [f"{self.name}.{i}" for i in range(layers)] if self.per_layer else [self.name]

    def to_dict(self) -> dict:
        return {"name": self.name, "batch_axis": self.batch_axis, "slot_axis": self.slot_axis,
                "per_layer": self.per_layer}

    @classmethod
    def from_dict(cls, data: dict, where: str) -> StateTensor:
        if not isinstance(data, dict):
            raise EdgecapError(f"{where}: expected an object, got {type(data).__name__}")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise EdgecapError(f"{where}.name: {name!r}, expected a tensor name")
        batch = data.get("batch_axis")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise EdgecapError(f"{where}.batch_axis: {batch!r}, expected an axis (integer >= 0)")
        slot = data.get("slot_axis")
        if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int) or slot < 0):
            raise EdgecapError(f"{where}.slot_axis: {slot!r}, expected an axis (integer >= 0) or null")
        per_layer = data.get("per_layer", False)
        if not isinstance(per_layer, bool):
            raise EdgecapError(f"{where}.per_layer: {per_layer!r}, expected true or false")
        return cls(name, batch, slot, per_layer)


def cache_tensor(name: str, batch_axis: int, slot_axis: int | None = None, per_layer: bool = True) -> StateTensor:
    """A cache tensor; per layer unless said otherwise."""
    return StateTensor(name, batch_axis, slot_axis, per_layer)


def cross_tensor(name: str, batch_axis: int, per_layer: bool = False) -> StateTensor:
    """A cross tensor: computed once per image, never written by the step."""
    return StateTensor(name, batch_axis, None, per_layer)


@dataclass(frozen=True)
class StateDescription:
    """A family's decoding state: its cache and cross tensors, in the order the model's `step`
    takes them, and how many layers a per-layer tensor has."""

    cache: tuple[StateTensor, ...]
    cross: tuple[StateTensor, ...]
    layers: int = 1

    def __post_init__(self):
        names = [t.name for t in (*self.cache, *self.cross)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise EdgecapError(f"state tensor name(s) {', '.join(twice)} declared twice")

    # -- the model's side: tensors as stacked per layer ----------------------------------------
    @property
    def cache_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.cache)

    @property
    def cross_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.cross)

    def named(self, group: str, tensors) -> dict:
        """The model's tensors of `group` ("cache" or "cross"), in declared order, by name."""
        return dict(zip((t.name for t in getattr(self, group)), tensors, strict=True))

    # -- the graph's side: per-layer tensors apart ---------------------------------------------
    def graph_names(self, group: str) -> list[str]:
        return [n for t in getattr(self, group) for n in t.graph_names(self.layers)]

    def graph_tensors(self, group: str) -> list[StateTensor]:
        """One entry per graph tensor (a per-layer tensor once per layer, each under its own
        graph name)."""
        return [StateTensor(n, t.batch_axis, t.slot_axis, False)
                for t in getattr(self, group) for n in t.graph_names(self.layers)]

    # -- the manifest --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"layers": self.layers, "cache": [t.to_dict() for t in self.cache],
                "cross": [t.to_dict() for t in self.cross]}

    @classmethod
    def from_dict(cls, data: dict, where: str) -> StateDescription:
        if not isinstance(data, dict):
            raise EdgecapError(f"{where}: expected an object, got {type(data).__name__}")
        layers = data.get("layers")
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise EdgecapError(f"{where}.layers: {layers!r}, expected an integer >= 1")
        groups = {}
        for group in ("cache", "cross"):
            items = data.get(group)
            if not isinstance(items, list):
                raise EdgecapError(f"{where}.{group}: expected a list of state tensors")
            groups[group] = tuple(StateTensor.from_dict(t, f"{where}.{group}[{i}]") for i, t in enumerate(items))
        return cls(groups["cache"], groups["cross"], layers)
