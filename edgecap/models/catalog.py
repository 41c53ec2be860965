"""The lists docs/models.md shows, made from the code: registries, presets, attention modules.

    python -m edgecap.models.catalog docs/models.md    # rewrite the generated blocks

Each block sits between `<!-- catalog: NAME -->` and `<!-- /catalog -->`; a test fails when a
block differs from what the code says, so the doc cannot fall behind a new preset or variant.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

from edgecap.io import write_text_atomic
from edgecap.models import preset_config
from edgecap.models.registry import (
    ATTENTION,
    CROSS_ATTENTION,
    DECODER_SELF_ATTENTION,
    DECODERS,
    ENCODER_ATTENTION,
    REGISTRIES,
    list_models,
)

_BLOCK = re.compile(r"(<!-- catalog: (\w+) -->\n)(.*?)(<!-- /catalog -->)", re.S)


def _where(module: str) -> str:
    """edgecap.models.attention.memory -> attention/memory.py (the path under edgecap/models/)."""
    return module.removeprefix("edgecap.models.").replace(".", "/") + ".py"


def registries() -> str:
    lines = []
    for registry in REGISTRIES:
        names = ", ".join(f"`{name}` ({_where(registry.get(name).__module__)})" for name in registry.names())
        lines.append(f"- {registry.kind}: {names}")
    return "\n".join(lines) + "\n"


def presets() -> str:
    lines = ["| preset | family | decoder | encoder attention | decoder self-attention | cross-attention | "
             "front end | layers | d |", "|---|---|---|---|---|---|---|---|---|"]
    for name in list_models():
        c = preset_config(name)
        decoder = DECODERS.get(c.decoder)
        used = dict(decoder.attention_parts(c))  # a decoder without attention uses none: "-"
        parts = [used.get(r, "-") for r in (ENCODER_ATTENTION, DECODER_SELF_ATTENTION, CROSS_ATTENTION)]
        lines.append(f"| `{name}` | {c.family} | {c.decoder} | {' | '.join(parts)} | "
                     f"{c.visual.kind} | {decoder.layers_label(c)} | {c.d_model} |")
    return "\n".join(lines) + "\n"


def attention_modules() -> str:
    package = importlib.import_module(ATTENTION)
    lines = ["| module | what it is |", "|---|---|"]
    for found in sorted(pkgutil.iter_modules(package.__path__, ATTENTION + "."), key=lambda m: m.name):
        module = importlib.import_module(found.name)
        summary = " ".join((inspect.getdoc(module) or "").split("\n\n")[0].split())
        lines.append(f"| `{_where(found.name)}` | {summary} |")
    return "\n".join(lines) + "\n"


BLOCKS = {"registries": registries, "presets": presets, "attention_modules": attention_modules}


def rewrite(text: str) -> str:
    """`text` with every catalog block made anew."""
    def block(match):
        return match.group(1) + BLOCKS[match.group(2)]() + match.group(4)

    return _BLOCK.sub(block, text)


def blocks(text: str) -> dict[str, str]:
    return {m.group(2): m.group(3) for m in _BLOCK.finditer(text)}


def main(argv=None) -> int:
    path = Path((argv or sys.argv[1:] or ["docs/models.md"])[0])
    write_text_atomic(path, rewrite(path.read_text(encoding="utf-8")))
    print(f"rewrote the catalog blocks of {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
