"""`generate_dataset`: write every format of the synthetic world into one directory, atomically.

Layout of `out`:
    dataset_coco.json                   Karpathy splits, 5 captions per image
    images/<filepath>/<filename>        the Karpathy images (train2014/, val2014/)
    objects.json                        cocoid -> ground-truth objects (class, box, area)
    acvr/<seq>/labels.json, <frame>.png, <frame>_mask.png
    video/tabletop.mp4, video/tabletop.jsonl
    video/tabletop.mcap                 with mcap=True: the clip as a ROS 2 log (rosbag.py)
    synth.json                          the generator's settings, for provenance
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecap.argtypes import FRAME_COUNT, IMAGE_SIDE, SEED, SEQUENCE_FRAMES, SYNTH_IMAGES
from edgecap.errors import EdgecapError, require
from edgecap.io import SYNTHETIC_WORLD, atomic_dir, check_replaceable, probe_writable
from edgecap.jsonio import json_or_none
from edgecap.progress import progress_bar

from .budget import check_budget
from .grammar import captions
from .rosbag import McapClipSink
from .scene import render, sample_scene
from .world import TabletopWorld, rng_for
from .writers import (
    VideoSink,
    dump_json,
    ground_truth,
    karpathy_image,
    write_acvr_sequence,
    write_image,
)

STREAM_IMAGES = 1
STREAM_ACVR = 2
STREAM_SPLITS = 5
IMAGE_FORMATS = ("jpg", "png")


def split_plan(n: int, seed: int) -> list[str]:
    """Karpathy-like split names per image: ~5% val, ~5% test, ~10% restval, rest train."""
    n_eval = n // 20 if n >= 40 else (1 if n >= 4 else 0)
    n_restval = n // 10
    names = (["val"] * n_eval + ["test"] * n_eval + ["restval"] * n_restval)
    names += ["train"] * (n - len(names))
    order = rng_for(seed, STREAM_SPLITS, 0).permutation(n)
    out = [""] * n
    for slot, i in enumerate(order):
        out[int(i)] = names[slot]
    return out


def _check(n_images, seed, size, sequences, frames_per_sequence, video_frames, video_size, image_format):
    """The options `edgecap data synth` parses, checked again for library callers and training
    configs ([data.synth]): the same bounds (edgecap.argtypes), the same words."""
    for name, value, kind in (("--images", n_images, SYNTH_IMAGES), ("--size", size, IMAGE_SIDE),
                              ("--sequences", sequences, FRAME_COUNT), ("--video-frames", video_frames, FRAME_COUNT),
                              ("--frames-per-sequence", frames_per_sequence, SEQUENCE_FRAMES),
                              ("--video-size", video_size, IMAGE_SIDE), ("--seed", seed, SEED)):
        kind.check(value, name)
    if image_format not in IMAGE_FORMATS:
        raise EdgecapError(f"--format must be one of {', '.join(IMAGE_FORMATS)}, got {image_format!r}")


def generate_dataset(out, n_images: int, seed: int = 0, size: int = 128, sequences: int = 2,
                     frames_per_sequence: int = 20, video_frames: int = 150,
                     video_size: int | None = None, fps: float = 15.0,
                     image_format: str = "jpg", force: bool = False,
                     progress: bool = True, mcap: bool = False) -> dict:
    """Write the synthetic dataset to `out`; returns a summary (counts, paths)."""
    video_size = size if video_size is None else video_size
    _check(n_images, seed, size, sequences, frames_per_sequence, video_frames, video_size, image_format)
    check_budget(n_images, size, sequences, frames_per_sequence, video_frames, video_size, image_format)
    if mcap and not video_frames:
        raise EdgecapError("--mcap writes the video clip as a log; it needs --video-frames > 0")
    if mcap:  # before any rendering: a missing extra is a one-line message now, not later
        require("mcap_ros2", "ros", "writing the clip as an MCAP log")
        require("rosbags", "ros", "writing the clip as an MCAP log")
    out = Path(out)
    check_replaceable(out, SYNTHETIC_WORLD, force)  # before the slow part
    probe_writable(out)
    total = n_images + sequences * frames_per_sequence + video_frames
    bar = progress_bar(total=total, quiet=not progress, desc="synth", unit="img")
    try:
        with atomic_dir(out, SYNTHETIC_WORLD, force=force) as tmp:
            images = _write_karpathy(tmp, n_images, seed, size, image_format, bar)
            for j in range(sequences):
                _write_sequence(tmp / "acvr" / f"{j:06d}", seed, j, size, frames_per_sequence, bar)
            if video_frames:
                _write_video(tmp / "video" / "tabletop.mp4", seed, video_size, video_frames, fps, bar,
                             mcap)
            settings = {"generator": "edgecap.data.synth", "seed": seed, "images": n_images,
                        "size": size, "sequences": sequences,
                        "frames_per_sequence": frames_per_sequence,
                        "video_frames": video_frames, "video_size": video_size, "fps": fps,
                        "image_format": image_format, "mcap": mcap}
            dump_json(tmp / "synth.json", settings)
    finally:
        bar.close()
    return {"out": str(out), "images": len(images), "sequences": sequences,
            "frames_per_sequence": frames_per_sequence, "video_frames": video_frames,
            "mcap": str(out / "video" / "tabletop.mcap") if mcap else None}


def is_world_of(root: str | Path, synth: dict, keys=("seed", "size", "image_format")) -> bool:
    """Whether `root` holds a world `generate_dataset` wrote with these settings (a training
    config's [data.synth]): its synth.json agrees on `keys`."""
    root = Path(root)
    meta = root / "synth.json"
    if not (root / "dataset_coco.json").is_file() or not meta.is_file():
        return False
    have = json_or_none(meta)
    return isinstance(have, dict) and all(have.get(k) == synth.get(k) for k in keys)


def _write_karpathy(root: Path, n: int, seed: int, size: int, fmt: str, bar) -> list[dict]:
    splits = split_plan(n, seed)
    entries, objects = [], {}
    sentid = 0
    for i in range(n):
        rng = rng_for(seed, STREAM_IMAGES, i)
        scene = sample_scene(rng, size)
        frame = render(scene, None, size, rng)
        texts = captions(rng, frame.objects, scene.table_kind, scene.night, scene.high_camera, size)
        cocoid = i + 1
        filepath = "train2014" if splits[i] == "train" else "val2014"
        filename = f"SYNTH_{filepath}_{cocoid:012d}.{fmt}"
        write_image(root / "images" / filepath / filename, frame.image)
        entries.append(karpathy_image(i, cocoid, splits[i], filepath, filename, texts, sentid))
        sentid += len(texts)
        objects[str(cocoid)] = ground_truth(frame.objects)
        bar.update(1)
    dump_json(root / "dataset_coco.json", {"images": entries, "dataset": "coco"})
    dump_json(root / "objects.json", objects)
    return entries


def _write_sequence(directory: Path, seed: int, index: int, size: int, n_frames: int, bar) -> None:
    scene = sample_scene(rng_for(seed, STREAM_ACVR, index), size)
    frames = []
    for f in range(n_frames):
        # A slow sideways pass over the table, 0.2 m in all, with a slight bob.
        s = f / max(1, n_frames - 1)
        cam = scene.camera.moved(-0.1 + 0.2 * s, 0.02 * np.sin(2 * np.pi * s), 0.0)
        frames.append(render(scene, cam, size, rng_for(seed, STREAM_ACVR, index, f + 1)))
        bar.update(1)
    write_acvr_sequence(directory, frames)


def _write_video(path: Path, seed: int, size: int, n_frames: int, fps: float, bar,
                 mcap: bool = False) -> None:
    world = TabletopWorld(seed, size, fps)
    sink = VideoSink(path, size, fps)
    log = None
    if mcap:
        log = McapClipSink(path.with_suffix(".mcap"), world)
    try:
        for t in range(n_frames):
            frame = world.render(t)
            sink.write(frame, world.scene_index(t))
            if log is not None:
                log.write(t, frame.image)
            bar.update(1)
        if log is not None:
            log.close()
    finally:
        sink.close()
        if log is not None:
            log.abort()  # no-op once closed; removes the unfinished log otherwise


__all__ = ["generate_dataset", "is_world_of", "split_plan"]
