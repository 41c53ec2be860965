"""Representative inputs for every graph, recorded while the fp32 bundle captions sample inputs.

Static int8 quantization and the TensorRT INT8 calibrator need the tensors each graph really
sees: images (or features), the encoder's inputs, and the decoder step's token / step / cache /
cross at every step of beam search. Running the fp32 ONNX bundle itself gives exactly those,
with no PyTorch in the loop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecap.contract.beam import DecodeOptions
from edgecap.errors import EdgecapError
from edgecap.runtime.session import Bundle


class _Recorder:
    def __init__(self, graph, store: list, limit: int):
        self.graph, self.entry, self.store, self.limit = graph, graph.entry, store, limit

    def _keep(self, feeds):
        if len(self.store) < self.limit:
            names = {t.name for t in self.entry.inputs}
            self.store.append({k: np.array(v, copy=True) for k, v in feeds.items() if k in names})

    def run(self, feeds):
        self._keep(feeds)
        return self.graph.run(feeds)

    def bind(self, inputs, outputs):
        run = self.graph.bind(inputs, outputs)

        def record_and_run():
            self._keep(inputs)  # the bound buffers hold this call's inputs now
            run()
        return record_and_run


def record_feeds(bundle: Bundle, batches: list[np.ndarray | tuple], limit: int = 64) -> dict[str, list[dict]]:
    """role -> list of feed dicts, from captioning `batches` (model inputs, numpy, static batch)."""
    store: dict[str, list[dict]] = {role: [] for role in bundle._graphs}
    original = dict(bundle._graphs)
    try:
        for role, graph in original.items():
            bundle._graphs[role] = _Recorder(graph, store[role], limit)
        options = DecodeOptions(beam_size=bundle.beam_size, max_len=bundle.max_len)
        n_extra = len(bundle.encode_extra_names)
        for inputs in batches:
            front, extra = (inputs[:-n_extra], inputs[-n_extra:]) if n_extra else (inputs, ())
            feats, mask = bundle.visual(front[0]) if bundle.has_visual else front
            bundle.decode(bundle.encode(feats, mask, *extra), options)
    finally:
        bundle._graphs.update(original)
    return store


# -- images for a front end's static int8 ------------------------------------------------------
# frames of the synthetic world one scene apart (a scene lasts 60 frames at its 15 fps): the
# default calibration and evaluation images, different scenes for each
CALIBRATION_SEED, EVALUATION_SEED = 0, 1
WORLD_SIZE = 320  # px: the preprocessing resizes (and crops) as for a camera frame


def world_frames(count: int, seed: int) -> list[np.ndarray]:
    from edgecap.data.synth import TabletopWorld

    world = TabletopWorld(seed=seed, size=WORLD_SIZE)
    return [world.render_frame(i * world.scene_frames)[0] for i in range(count)]


def folder_frames(folder: str, count: int) -> list[np.ndarray]:
    """Up to `count` images of `folder` (its own files, name order) as BGR uint8 frames, read
    as `edgecap run` reads a folder (edgecap.runtime.sources.read_image): an empty, damaged or
    undecodable image, or a name that is a symbolic link loop, is refused naming it (a grey half
    of a cut JPEG would calibrate the int8 ranges silently)."""
    from edgecap.runtime.sources import BadFrame, folder_images, no_images_reason, read_image

    path = Path(folder)
    if not path.is_dir():
        raise EdgecapError(f"--calibration {folder}: not a directory (expected a folder of images)")
    files = folder_images(path)
    if not files:
        raise EdgecapError(f"--calibration {folder}: {no_images_reason(path)}")
    frames = []
    for file in files[:count]:
        try:
            frames.append(read_image(file))
        except BadFrame as exc:
            raise EdgecapError(f"--calibration: {exc}") from None
    return frames


def image_batches(frames: list[np.ndarray], preprocessing: dict, batch: int) -> list[np.ndarray]:
    """Frames preprocessed as the bundle's manifest says, in batches of the graph's static
    batch (the last one filled up with the first frames again)."""
    from edgecap.contract.preprocess import preprocess_as

    images = np.stack([preprocess_as(f, preprocessing) for f in frames])
    short = -len(images) % batch
    if short:
        images = np.concatenate([images, images[np.arange(short) % len(images)]])
    return [images[i:i + batch] for i in range(0, len(images), batch)]


def calibration_images(folder: str, count: int, preprocessing: dict, batch: int) -> tuple[list[np.ndarray], str]:
    """(batches of preprocessed images, where they came from): the user's folder, else the
    synthetic world."""
    if folder:
        frames = folder_frames(folder, count)
        return image_batches(frames, preprocessing, batch), f"{len(frames)} images of {folder}"
    frames = world_frames(count, CALIBRATION_SEED)
    return image_batches(frames, preprocessing, batch), f"{count} synthetic-world frames (seed {CALIBRATION_SEED})"
