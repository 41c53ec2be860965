"""Drawing captions and objects on frames (OpenCV), and the `--save-video` / `--show` sinks.

Boxes of known objects: green when the caption names the object's class outright (coverage's
exact match: class name or synonym), yellow when coverage matched it to a similar noun (GloVe
profit >= 0.5, shown), thin grey otherwise: weaker GloVe matches still count in the coverage
score but are not called "mentioned" in the picture. Small frames (the synthetic world's
128 px) are enlarged so the caption is readable; the caption goes in a band under the frame,
so it hides nothing.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError
from edgecap.io import WorkDir, probe_writable

from .records import Record
from .sources import KnownObject

GREEN, YELLOW, GREY, WHITE, BLACK = (60, 200, 60), (0, 210, 240), (150, 150, 150), (255, 255, 255), (0, 0, 0)
MIN_WIDTH = 512
MENTION_PROFIT = 0.5
CAPTION_LINES = 3


def object_marks(record: Record) -> list[tuple[KnownObject, str, tuple[int, int, int], int]]:
    """(object, label, BGR colour, line thickness) per known object of the record: green when
    the caption names its class, yellow for a similar noun, grey when not named. The video,
    the window and the MCAP caption log (ImageAnnotations) all draw from this."""
    matched = {m["class"]: m for m in (record.matches or [])
               if m.get("exact") or m.get("profit", 0.0) >= MENTION_PROFIT}
    marks = []
    for obj in record.frame.objects or []:
        m = matched.get(obj.cls)
        color, thick = (GREEN, 3) if m and m.get("exact") else (YELLOW, 2) if m else (GREY, 1)
        label = obj.cls if not m or m.get("exact") else f"{obj.cls} ~{m['noun']} {m['profit']:.2f}"
        marks.append((obj, label, color, thick))
    return marks


def annotate(record: Record, min_width: int = MIN_WIDTH) -> np.ndarray:
    """A copy of the record's frame, enlarged to at least `min_width`, with boxes and caption."""
    import cv2

    image = record.frame.image
    scale = max(1.0, min_width / image.shape[1])
    if scale > 1.0:
        canvas = cv2.resize(image, (round(image.shape[1] * scale), round(image.shape[0] * scale)),
                            interpolation=cv2.INTER_NEAREST)
    else:
        canvas = image.copy()
    for obj, label, color, thick in object_marks(record):
        left, top, right, bottom = (int(round(v * scale)) for v in obj.box)
        cv2.rectangle(canvas, (left, top), (right, bottom), color, thick)
        cv2.putText(canvas, label, (left + 2, max(12, top - 4)), cv2.FONT_HERSHEY_SIMPLEX, 0.45,
                    color, 1, cv2.LINE_AA)
    width = canvas.shape[1]
    chars = max(20, int(width / 11))
    # A fixed band height keeps every frame of a video the same size.
    lines = textwrap.wrap(record.caption.text or "(empty caption)", chars,
                          max_lines=CAPTION_LINES, placeholder=" ...")
    info = f"frame {record.frame.frame_id}  {record.capture_to_caption_ms:.0f} ms"
    if record.coverage:
        first = next(iter(record.coverage.items()))
        if first[1] is not None:
            info += f"  coverage {first[0]} {100 * first[1]:.0f}%"
    band = 10 + 24 * (CAPTION_LINES + 1)
    height = canvas.shape[0]
    canvas = cv2.copyMakeBorder(canvas, 0, band, 0, 0, cv2.BORDER_CONSTANT, value=BLACK)
    y = height + 22
    for line in lines:
        cv2.putText(canvas, line, (8, y), cv2.FONT_HERSHEY_SIMPLEX, 0.6, WHITE, 1, cv2.LINE_AA)
        y += 24
    cv2.putText(canvas, info, (8, y), cv2.FONT_HERSHEY_SIMPLEX, 0.5, GREY, 1, cv2.LINE_AA)
    return canvas


# containers OpenCV's writer fills with mp4v video (checked with OpenCV 4.x and 5.x)
VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".avi", ".mkv")


def check_video_path(path: str | os.PathLike) -> None:
    """Fail (one line) before anything runs when `path` cannot become a video."""
    path = Path(path)
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        what = f"a {path.suffix} file" if path.suffix else "a file without a suffix"
        raise EdgecapError(f"--save-video {path}: OpenCV cannot write video into {what}; "
                           f"use one of {', '.join(VIDEO_SUFFIXES)}")
    probe_writable(path, "--save-video", file=True)


class VideoSink:
    """Annotated frames to a video (OpenCV mp4v), written in a work directory beside the target
    and renamed on close, so an aborted run never leaves a half-written video under the final
    name (and a killed one leaves a work directory the next write removes)."""

    def __init__(self, path: str | os.PathLike, fps: float = 10.0):
        check_video_path(path)
        self.path = Path(path)
        self.fps = float(fps)
        self._work = self._writer = self._size = None
        self.count = 0

    def write(self, record: Record) -> None:
        import cv2

        frame = annotate(record)
        size = (frame.shape[1], frame.shape[0])
        if self._writer is None:
            self._work = WorkDir(self.path, "--save-video")
            writer = cv2.VideoWriter(str(self._work.file()), cv2.VideoWriter_fourcc(*"mp4v"), self.fps, size)
            if not writer.isOpened():
                raise EdgecapError(f"--save-video {self.path}: OpenCV cannot write mp4v video there")
            self._writer, self._size = writer, size
        if size != self._size:  # a stream that changed resolution on reopen
            frame = cv2.resize(frame, self._size, interpolation=cv2.INTER_AREA)
        self._writer.write(frame)
        self.count += 1

    def close(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None
            self._work.commit(self._work.file())
        if self._work is not None:
            self._work.close()


class Window:
    """`--show`: an OpenCV window; needs a desktop OpenCV build (opencv-python, not -headless)."""

    NAME = "edgecap"

    def __init__(self):
        import cv2

        try:
            cv2.namedWindow(self.NAME, cv2.WINDOW_NORMAL)
        except cv2.error:
            raise EdgecapError("--show needs an OpenCV build with GUI support and a display "
                               "(this one has none: pip install opencv-python instead of "
                               "opencv-python-headless); --save-video FILE works without") from None
        self.closed = False

    def write(self, record: Record) -> None:
        import cv2

        cv2.imshow(self.NAME, annotate(record))
        if cv2.waitKey(1) & 0xFF in (ord("q"), 27):
            self.closed = True

    def close(self) -> None:
        import cv2

        cv2.destroyAllWindows()
