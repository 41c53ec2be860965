"""Registries of plug-in parts and of model presets.

Variant modules register their classes with a decorator and are found by the registry
itself (every module of the attention and front-end packages); presets are JSON files in
`models/configs/`, one per model, so a new size needs no code.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from importlib import resources

from edgecap.errors import EdgecapError, did_you_mean


class Registry:
    """Name -> class. Duplicate or unknown names raise, listing the valid ones.

    A registry finds its classes itself: `places` are modules and packages whose modules
    register classes when imported (a package: every module in it, found with pkgutil), so a
    new variant is a new module in its package and no list names it."""

    def __init__(self, kind: str, places: tuple[str, ...]):
        self.kind = kind
        self.places = places
        self._items: dict[str, type] = {}

    def register(self, name: str):
        def wrap(cls):
            if self._items.get(name, cls) is not cls:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = cls
            return cls

        return wrap

    def discover(self) -> None:
        """Import every module of this registry's places (imports are cached: cheap again)."""
        for place in self.places:
            module = importlib.import_module(place)
            for found in pkgutil.iter_modules(getattr(module, "__path__", ()), place + "."):
                importlib.import_module(found.name)

    def get(self, name: str):
        if name not in self._items:
            self.discover()
        if name not in self._items:
            raise EdgecapError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, self._items)}; "
                f"valid: {', '.join(sorted(self._items))}"
            )
        return self._items[name]

    def names(self) -> list[str]:
        self.discover()
        return sorted(self._items)


ATTENTION = "edgecap.models.attention"
ENCODER_ATTENTION = Registry("encoder attention", (ATTENTION,))
DECODER_SELF_ATTENTION = Registry("decoder self-attention", (ATTENTION,))
CROSS_ATTENTION = Registry("cross-attention", (ATTENTION,))
DECODERS = Registry("decoder", ("edgecap.models.core", "edgecap.models.lstm"))
VISUAL = Registry("visual front end", ("edgecap.models.visual", "edgecap.models.frontends"))
# A variant's own hyper-parameters: a dataclass registered, beside the variant, under the name of
# its section in every model config ("memory": {"slots": 40}); CaptionerConfig holds the shared
# fields and one instance of each registered section.
CONFIG_SECTIONS = Registry("config section", (ATTENTION, "edgecap.models.core", "edgecap.models.lstm"))
REGISTRIES = (ENCODER_ATTENTION, DECODER_SELF_ATTENTION, CROSS_ATTENTION, DECODERS, VISUAL, CONFIG_SECTIONS)


def part_classes(cfg) -> list[type]:
    """The classes a model of `cfg` is built from: its decoder, the attention variants that
    decoder uses, its front end (a variant's class says what it needs beyond the core, e.g.
    `training_hook`)."""
    decoder = DECODERS.get(cfg.decoder)
    return [decoder, *(registry.get(name) for registry, name in decoder.attention_parts(cfg)),
            VISUAL.get(cfg.visual.kind)]


# Where presets are found: the package's own configs/ (a list, so a test can add a folder).
PRESET_FOLDERS: list = [resources.files("edgecap.models") / "configs"]


def _preset_files() -> dict[str, object]:
    return {p.name[:-5]: p for folder in PRESET_FOLDERS for p in folder.iterdir() if p.name.endswith(".json")}


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
