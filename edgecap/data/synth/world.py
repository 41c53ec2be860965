"""The live world: an endless, random-access stream of frames from a moving camera.

Used by the runtime as the camera source `synth://tabletop`. Frame t is a pure function of
(seed, size, t): a new table every `scene_seconds`, and a camera that drifts and bobs
smoothly along a path that does not jump when the scene changes.
"""

from __future__ import annotations

import math

import numpy as np

from .grammar import captions
from .scene import Camera, Rendered, Scene, render, sample_scene

STREAM_WORLD = 3  # random streams: 1 Karpathy images, 2 ACVR sequences, 3 this world
STREAM_NOISE = 4


def rng_for(seed: int, stream: int, index: int, sub: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), stream, int(index), sub]))


def camera_path(base: Camera, t: float, fps: float) -> Camera:
    """A slow pan with a little bob, as a robot's head camera moves; smooth in t."""
    s = t / fps
    dx = 0.1 * math.sin(2 * math.pi * s / 9.0) + 0.03 * math.sin(2 * math.pi * s / 2.7)
    dh = 0.03 * math.sin(2 * math.pi * s / 6.0)
    dhor = 0.015 * math.sin(2 * math.pi * s / 3.3)
    return base.moved(dx, dh, dhor)


class TabletopWorld:
    """`render_frame(t)` -> (BGR uint8 image, objects) for integer frame index t >= 0."""

    def __init__(self, seed: int = 0, size: int = 128, fps: float = 15.0,
                 scene_seconds: float = 4.0):
        self.seed = int(seed)
        self.size = int(size)
        self.fps = float(fps)
        self.scene_frames = max(1, int(round(scene_seconds * fps)))
        self._cache: tuple[int, Scene] | None = None

    def scene_index(self, t: int) -> int:
        return int(t) // self.scene_frames

    def scene(self, index: int) -> Scene:
        if self._cache is None or self._cache[0] != index:
            self._cache = (index, sample_scene(rng_for(self.seed, STREAM_WORLD, index), self.size))
        return self._cache[1]

    def camera(self, t: int) -> Camera:
        """Where the camera is at frame t (its intrinsics: edgecap.data.synth.rosbag)."""
        return camera_path(self.scene(self.scene_index(t)).camera, t, self.fps)

    def render(self, t: int) -> Rendered:
        if t < 0:
            raise ValueError(f"frame index must be >= 0, got {t}")
        scene = self.scene(self.scene_index(t))
        return render(scene, self.camera(t), self.size, rng_for(self.seed, STREAM_NOISE, t))

    def render_frame(self, t: int) -> tuple[np.ndarray, list[dict]]:
        frame = self.render(t)
        return frame.image, frame.objects

    def reference_captions(self, t: int, n: int = 5) -> list[str]:
        """Grammar captions of frame t, e.g. as references for live CIDEr."""
        frame = self.render(t)
        scene = self.scene(self.scene_index(t))
        return captions(rng_for(self.seed, STREAM_NOISE, t, 1), frame.objects, scene.table_kind,
                        scene.night, scene.high_camera, self.size, n)
