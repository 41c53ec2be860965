"""How big a synthetic world may be, checked before anything is rendered or written.

Each option has its own range (edgecap.argtypes), but their product does not: `--sequences
1000000 --frames-per-sequence 1000000` or `--video-frames 1000000 --video-size 2048` were
accepted and would have rendered for weeks. A world is refused, in one line with the estimate,
when it exceeds any of:

- MAX_FRAMES rendered frames (Karpathy images + ACVR frames + video frames);
- MAX_PIXELS rendered pixels (what rendering time follows: about RENDER_PIXELS_PER_S on one
  core of the development machine, 16 ms for a 128 px frame, 1.8 s for a 2048 px one);
- MAX_BYTES written, estimated from the bytes per pixel the world's frames take once encoded
  (measured on its own renders: JPEG ~0.4-0.6, PNG ~1.7-1.9, an ACVR frame's PNG plus its mask,
  mp4v video ~0.07) plus each frame's share of the JSON beside it;
- MAX_SEQUENCE_BYTES of one ACVR sequence, which is held in memory until its labels are written.
"""

from __future__ import annotations

from edgecap.errors import EdgecapError

MAX_FRAMES = 2_000_000
MAX_PIXELS = 100e9
MAX_BYTES = 100e9
MAX_SEQUENCE_BYTES = 4e9
RENDER_PIXELS_PER_S = 2e6
BYTES_PER_PIXEL = {"jpg": 0.6, "png": 2.0, "acvr": 2.2, "video": 0.1}
BYTES_PER_FRAME = 1000       # captions, labels, the clip's ground-truth line
HELD_BYTES_PER_PIXEL = 4     # an ACVR frame in memory: BGR image + its label map


def _size(n: float) -> str:
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 1e3:,.0f} kB"


def _duration(seconds: float) -> str:
    for unit, scale in (("years", 365 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= scale:
            return f"{seconds / scale:,.1f} {unit}"
    return f"{seconds:.0f} s"


def estimate(images: int, size: int, sequences: int, frames_per_sequence: int, video_frames: int,
             video_size: int, image_format: str) -> dict:
    """Frames, pixels, bytes written and render time of a world of these settings."""
    acvr = sequences * frames_per_sequence
    pixels = (images + acvr) * size * size + video_frames * video_size * video_size
    frames = images + acvr + video_frames
    written = (images * size * size * BYTES_PER_PIXEL[image_format] + acvr * size * size * BYTES_PER_PIXEL["acvr"]
               + video_frames * video_size * video_size * BYTES_PER_PIXEL["video"] + frames * BYTES_PER_FRAME)
    return {"frames": frames, "pixels": pixels, "bytes": written, "seconds": pixels / RENDER_PIXELS_PER_S,
            "sequence_bytes": frames_per_sequence * size * size * HELD_BYTES_PER_PIXEL if sequences else 0}


def check_budget(images: int, size: int, sequences: int, frames_per_sequence: int, video_frames: int,
                 video_size: int, image_format: str) -> dict:
    """The estimate, or a one-line EdgecapError when the world is over a ceiling."""
    est = estimate(images, size, sequences, frames_per_sequence, video_frames, video_size, image_format)
    over = []
    if est["frames"] > MAX_FRAMES:
        over.append(f"{est['frames']:,} frames (ceiling {MAX_FRAMES:,})")
    if est["pixels"] > MAX_PIXELS:
        over.append(f"{est['pixels']:.3g} rendered pixels (ceiling {MAX_PIXELS:.3g})")
    if est["bytes"] > MAX_BYTES:
        over.append(f"about {_size(est['bytes'])} written (ceiling {_size(MAX_BYTES)})")
    if est["sequence_bytes"] > MAX_SEQUENCE_BYTES:
        over.append(f"{_size(est['sequence_bytes'])} held in memory per ACVR sequence of {frames_per_sequence:,} "
                    f"frames (ceiling {_size(MAX_SEQUENCE_BYTES)})")
    if over:
        raise EdgecapError(
            f"this world is too big: {'; '.join(over)}; it would take about {_duration(est['seconds'])} to "
            f"render at {RENDER_PIXELS_PER_S / 1e6:.0f} megapixels a second. Ask for fewer frames (--images, "
            "--sequences x --frames-per-sequence, --video-frames) or smaller ones (--size, --video-size)")
    return est
