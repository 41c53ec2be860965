"""Registries of plug-in parts and of model presets.

Variant modules register their classes with a decorator; presets are JSON files in
`models/configs/`, one per model, so a new size needs no code.
"""

from __future__ import annotations

import json
from importlib import resources

from edgecap.errors import EdgecapError, did_you_mean


class Registry:
    """Name -> class. Duplicate or unknown names raise, listing the valid ones."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, type] = {}

    def register(self, name: str):
        def wrap(cls):
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = cls
            return cls

        return wrap

    def get(self, name: str):
        _load_variants()
        if name not in self._items:
            raise EdgecapError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, self._items)}; "
                f"valid: {', '.join(sorted(self._items))}"
            )
        return self._items[name]

    def names(self) -> list[str]:
        _load_variants()
        return sorted(self._items)


ENCODER_ATTENTION = Registry("encoder attention")
DECODER_SELF_ATTENTION = Registry("decoder self-attention")
CROSS_ATTENTION = Registry("cross-attention")
DECODERS = Registry("decoder")
VISUAL = Registry("visual front end")

_VARIANT_MODULES = (
    "edgecap.models.attention.base",
    "edgecap.models.attention.memory",
    "edgecap.models.attention.prototype",
    "edgecap.models.attention.cross",
    "edgecap.models.attention.meshed",
    "edgecap.models.attention.retrieval",
    "edgecap.models.attention.clustering",
    "edgecap.models.core",
    "edgecap.models.lstm",
    "edgecap.models.visual",
    "edgecap.models.frontends.openclip",
    "edgecap.models.frontends.tv",
)


def _load_variants() -> None:
    import importlib

    for module in _VARIANT_MODULES:
        importlib.import_module(module)


def _preset_files() -> dict[str, object]:
    folder = resources.files("edgecap.models") / "configs"
    return {p.name[:-5]: p for p in folder.iterdir() if p.name.endswith(".json")}


def list_models() -> list[str]:
    """Names of the bundled presets (one JSON file each in models/configs/)."""
    return sorted(_preset_files())


def load_preset(name: str) -> dict:
    files = _preset_files()
    if name not in files:
        raise EdgecapError(
            f"unknown model {name!r}{did_you_mean(name, files)}; valid: {', '.join(sorted(files))}"
        )
    return json.loads(files[name].read_text(encoding="utf-8"))
