"""open_clip itself and its model names, below both the front-end table (base.py, which
recognises an open_clip backbone by name) and the open_clip front end (openclip.py)."""

from __future__ import annotations

from functools import lru_cache

from edgecap.errors import require


def open_clip_module():
    return require("open_clip", "train", "open_clip visual front ends")


@lru_cache(maxsize=1)
def open_clip_names() -> tuple[str, ...]:
    return tuple(open_clip_module().list_models())
