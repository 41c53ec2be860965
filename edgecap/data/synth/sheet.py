"""A contact sheet of example scenes, each with its first caption, for the docs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import cv2
import numpy as np

from edgecap.argtypes import SEED, SHEET_GRID, SHEET_TILE
from edgecap.png import check_target, save_image

from .grammar import captions
from .scene import render, sample_scene
from .world import rng_for

STREAM_SHEET = 6


def contact_sheet(out, seed: int = 0, grid: int = 4, size: int = 128, scale: float = 1.25) -> Path:
    SHEET_GRID.check(grid, "--grid")
    SHEET_TILE.check(size, "--size")
    SEED.check(seed, "--seed")
    check_target(out)
    tile = int(round(size * scale))
    text_h = 46
    sheet = np.full((grid * (tile + text_h), grid * tile, 3), 255, np.uint8)
    for i in range(grid * grid):
        rng = rng_for(seed, STREAM_SHEET, i)
        scene = sample_scene(rng, size)
        frame = render(scene, None, size, rng)
        text = captions(rng, frame.objects, scene.table_kind, scene.night, scene.high_camera,
                        size, n=1)[0]
        r, c = divmod(i, grid)
        y, x = r * (tile + text_h), c * tile
        sheet[y:y + tile, x:x + tile] = cv2.resize(frame.image, (tile, tile),
                                                   interpolation=cv2.INTER_AREA)
        for j, line in enumerate(textwrap.wrap(text, width=int(tile / 5.6))[:3]):
            cv2.putText(sheet, line, (x + 3, y + tile + 13 + 14 * j), cv2.FONT_HERSHEY_SIMPLEX,
                        0.36, (10, 10, 10), 1, cv2.LINE_AA)
    # Coarser levels keep the PNG small (the sensor noise is incompressible otherwise).
    sheet = np.minimum(sheet.astype(np.int32) // 12 * 12 + 6, 255).astype(np.uint8)
    return save_image(sheet, out)
