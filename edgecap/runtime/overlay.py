"""Drawing captions and objects on frames (OpenCV), and the `--save-video` / `--show` sinks.

Boxes of known objects: green when the caption names the object's class outright (coverage's
exact match: class name or synonym), yellow when coverage matched it to a similar noun (GloVe
profit >= 0.5, shown), thin grey otherwise: weaker GloVe matches still count in the coverage
score but are not called "mentioned" in the picture. A legend under the frame says so. Labels
sit on a dark plate above their box, or inside it when the box touches the top edge, and are
shifted left rather than run off the right edge.

Small frames (the synthetic world's 96-128 px) are enlarged so the text is readable. Under the
frame, a band holds the caption (shrunk to fit its lines, then cut with "..."), coverage at
every area threshold, and frame id, latency, beam and the legend; it is exactly as tall as
those lines. A video needs one frame size, so `--save-video` reserves two caption lines
(`annotate(..., caption_lines=2)`), centring a shorter caption in them.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError
from edgecap.io import WorkDir, free_bytes, free_space, probe_writable

from .records import Record
from .sources import KnownObject, opencv_log_silent

GREEN, YELLOW, GREY, WHITE, BLACK = (60, 200, 60), (0, 210, 240), (150, 150, 150), (255, 255, 255), (0, 0, 0)
PLATE = (30, 30, 30)  # label background
MIN_WIDTH = 512
BAND_OPACITY = 0.75  # annotate(over=True): how much of the band covers the frame below it
MENTION_PROFIT = 0.5
MAX_CAPTION_LINES = 3
VIDEO_CAPTION_LINES = 2
FONT = 0  # cv2.FONT_HERSHEY_SIMPLEX
CAPTION_SCALES = (0.6, 0.52, 0.45)  # tried in turn until the caption fits its lines
INFO_SCALE, LABEL_SCALE = 0.45, 0.45
MARGIN, GAP = 8, 6
LEGEND = (("named", GREEN), ("soft match", YELLOW), ("not named", GREY))
MENTION_BY_COLOUR = {color: name for name, color in LEGEND}


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


def _text_size(text: str, scale: float) -> tuple[int, int, int]:
    """(width, height above the baseline, depth below it) in pixels."""
    import cv2

    (w, h), base = cv2.getTextSize(text, FONT, scale, 1)
    return w, h, base


def label_rect(box: tuple[int, int, int, int], text: str, width: int, height: int) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a box label's plate, always inside the width x height frame:
    above the box when there is room, else just inside its top edge; moved left, never cut, at
    the right edge."""
    w, h, base = _text_size(text, LABEL_SCALE)
    plate_w, plate_h = w + 6, h + base + 4
    left = min(max(0, box[0]), max(0, width - plate_w))
    top = box[1] - plate_h
    if top < 0:
        top = max(0, box[1]) + 1
    top = min(top, max(0, height - plate_h))
    return left, top, left + plate_w, top + plate_h


def _draw_label(canvas: np.ndarray, box, text: str, color) -> None:
    import cv2

    left, top, right, bottom = label_rect(box, text, canvas.shape[1], canvas.shape[0])
    cv2.rectangle(canvas, (left, top), (right - 1, bottom - 1), PLATE, cv2.FILLED)
    _, h, _ = _text_size(text, LABEL_SCALE)
    cv2.putText(canvas, text, (left + 3, top + 2 + h), FONT, LABEL_SCALE, color, 1, cv2.LINE_AA)


def _fit_caption(text: str, width: int, lines: int) -> tuple[list[str], float]:
    """The caption wrapped into at most `lines` lines of `width` pixels, at the largest scale
    that holds it whole; at the smallest scale, what does not fit ends in "..."."""
    for scale in CAPTION_SCALES:
        per_char = _text_size("abcdefghij klmnopqrstuvwxyz", scale)[0] / 27
        chars = max(10, int(width / per_char))
        wrapped = textwrap.wrap(text, chars)
        if len(wrapped) <= lines:
            return wrapped or [""], scale
    return textwrap.wrap(text, chars, max_lines=lines, placeholder=" ...") or [""], scale


def coverage_text(coverage: dict[str, float | None] | None) -> str:
    """'coverage  >1% 33%  >3% 50%  >5% 100%  >10% 100%' (every area threshold; '-' when no
    object is that large)."""
    if not coverage:
        return ""
    cells = [f"{k} {'-' if v is None else f'{100 * v:.0f}%'}" for k, v in coverage.items()]
    return "coverage  " + "  ".join(cells)


@dataclass
class _Band:
    caption: list[str]
    caption_scale: float
    caption_lines: int  # lines reserved for the caption
    coverage: str
    info: str
    legend: bool

    def height(self) -> int:
        cap_h = _text_size("Ay", self.caption_scale)
        info_h = _text_size("Ay", INFO_SCALE)
        line, small = cap_h[1] + cap_h[2] + GAP, info_h[1] + info_h[2] + GAP
        rows = line * self.caption_lines + small * (1 + bool(self.coverage))
        return MARGIN + rows + MARGIN - GAP


def _band(record: Record, width: int, caption_lines: int | None) -> _Band:
    text = record.caption.text or "(empty caption)"
    lines, scale = _fit_caption(text, width - 2 * MARGIN, caption_lines or MAX_CAPTION_LINES)
    info = f"frame {record.frame.frame_id}  {record.capture_to_caption_ms:.0f} ms  beam {record.caption.beam}"
    return _Band(lines, scale, caption_lines or len(lines), coverage_text(record.coverage), info,
                 legend=record.frame.objects is not None)


def _draw_band(canvas: np.ndarray, band: _Band, y0: int) -> None:
    import cv2

    width = canvas.shape[1]
    asc, desc = _text_size("Ay", band.caption_scale)[1:]
    line = asc + desc + GAP
    y = y0 + MARGIN + (band.caption_lines - len(band.caption)) * line // 2
    for text in band.caption:
        cv2.putText(canvas, text, (MARGIN, y + asc), FONT, band.caption_scale, WHITE, 1, cv2.LINE_AA)
        y += line
    y = y0 + MARGIN + band.caption_lines * line
    asc, desc = _text_size("Ay", INFO_SCALE)[1:]
    if band.coverage:
        cv2.putText(canvas, band.coverage, (MARGIN, y + asc), FONT, INFO_SCALE, WHITE, 1, cv2.LINE_AA)
        y += asc + desc + GAP
    cv2.putText(canvas, band.info, (MARGIN, y + asc), FONT, INFO_SCALE, GREY, 1, cv2.LINE_AA)
    if band.legend:  # right-aligned: swatch, word, swatch, word, ...
        parts = [(name, color, _text_size(name, INFO_SCALE)[0]) for name, color in LEGEND]
        total = sum(asc + 4 + w + 12 for _, _, w in parts) - 12
        x = max(MARGIN + _text_size(band.info, INFO_SCALE)[0] + 16, width - MARGIN - total)
        for name, color, w in parts:
            cv2.rectangle(canvas, (x, y + 1), (x + asc - 1, y + asc), color, cv2.FILLED)
            x += asc + 4
            cv2.putText(canvas, name, (x, y + asc), FONT, INFO_SCALE, color, 1, cv2.LINE_AA)
            x += w + 12


def annotate(record: Record, min_width: int = MIN_WIDTH, caption_lines: int | None = None,
             over: bool = False) -> np.ndarray:
    """A copy of the record's frame, enlarged to at least `min_width`, with boxes, labels and
    the band of caption, coverage and legend below. `caption_lines` fixes the caption's share of
    the band (a video's frames must all be one size); None fits it to this caption. `over`: the
    band is drawn over the frame's bottom rows instead, so the image keeps the frame's size."""
    import cv2

    image = record.frame.image
    scale = max(1.0, min_width / image.shape[1])
    if scale > 1.0:
        frame = cv2.resize(image, (round(image.shape[1] * scale), round(image.shape[0] * scale)),
                           interpolation=cv2.INTER_NEAREST)
    else:
        frame = image.copy()
    height, width = frame.shape[:2]
    labels = []
    for obj, label, color, thick in object_marks(record):
        box = tuple(int(round(v * scale)) for v in obj.box)
        cv2.rectangle(frame, box[:2], box[2:], color, thick)
        labels.append((box, label, color))
    for box, text, color in labels:  # after every box, so no box line crosses a label
        _draw_label(frame, box, text, color)
    band = _band(record, width, caption_lines)
    canvas = cv2.copyMakeBorder(frame, 0, band.height(), 0, 0, cv2.BORDER_CONSTANT, value=BLACK)
    _draw_band(canvas, band, height)
    if not over:
        return canvas
    # the band laid over the frame's bottom, darkened behind it: the image keeps its own size
    # (a ROS image topic's subscribers, overlays and recorders expect the camera's size)
    rows = min(band.height(), height)
    bottom = frame[height - rows:]
    frame[height - rows:] = cv2.addWeighted(bottom, 1.0 - BAND_OPACITY, canvas[height:height + rows],
                                            BAND_OPACITY, 0.0)
    return frame


# containers OpenCV's writer fills with mp4v video (checked with OpenCV 4.x and 5.x)
VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".avi", ".mkv")
VIDEO_CODEC = "mp4v"
FULL_BELOW = 1 << 20  # bytes: less free than this when FFmpeg fails to write is a full disk


def check_video_path(path: str | os.PathLike) -> None:
    """Fail (one line) before anything runs when `path` cannot become a video."""
    path = Path(path)
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        what = f"a {path.suffix} file" if path.suffix else "a file without a suffix"
        raise EdgecapError(f"--save-video {path}: OpenCV cannot write video into {what}; "
                           f"use one of {', '.join(VIDEO_SUFFIXES)}")
    if path.is_file() and path.stat().st_size and not _reads_as_ours(path):
        raise EdgecapError(f"--save-video {path} exists and is not a video edgecap could have written "
                           f"(OpenCV does not read it as {VIDEO_CODEC} video); not overwriting it "
                           "(choose another file)")
    probe_writable(path, "--save-video", file=True)


def _reads_as_ours(path: Path) -> bool:
    """An existing video OpenCV reads as MPEG-4 Part 2, what --save-video writes. Video files
    carry no mark OpenCV can write, so this is the closest test: a camera's or phone's H.264 /
    HEVC recording, or any non-video file, is refused; an mp4v video from elsewhere is not told
    apart."""
    import cv2

    capture = cv2.VideoCapture(str(path))
    try:
        fourcc = int(capture.get(cv2.CAP_PROP_FOURCC)) if capture.isOpened() else 0
    finally:
        capture.release()
    return fourcc.to_bytes(4, "little").decode("latin-1").upper() in ("FMP4", "MP4V")


class VideoSink:
    """Annotated frames to a video (OpenCV mp4v), written in a work directory beside the target
    and renamed on close, so an aborted run never leaves a half-written video under the final
    name (and a killed one leaves a work directory the next write removes). The work directory
    is claimed when the sink opens, at the start of the run: a second run saving to the same
    video is refused then, in one line naming the first, instead of racing it to the rename.

    OpenCV's writer does not raise when FFmpeg cannot write (a full disk): `write` returns
    False and FFmpeg logs "Failed to write frame". So each frame's result is checked, and the
    finished file is read back (it must open and hold every frame) before it is renamed into
    place; either failure is one line naming the video and the free space, and no video."""

    def __init__(self, path: str | os.PathLike, fps: float = 10.0):
        check_video_path(path)
        self.path = Path(path)
        self.fps = float(fps)
        self._writer = self._size = None
        self._work = WorkDir(self.path, "--save-video", exclusive=True)
        self.count = 0

    def write(self, record: Record) -> None:
        import cv2

        frame = annotate(record, caption_lines=VIDEO_CAPTION_LINES)
        size = (frame.shape[1], frame.shape[0])
        if self._writer is None:
            writer = cv2.VideoWriter(str(self._work.file()), cv2.VideoWriter_fourcc(*VIDEO_CODEC), self.fps, size)
            if not writer.isOpened():
                raise EdgecapError(f"--save-video {self.path}: OpenCV cannot write {VIDEO_CODEC} video there")
            self._writer, self._size = writer, size
        if size != self._size:  # a stream that changed resolution on reopen
            frame = cv2.resize(frame, self._size, interpolation=cv2.INTER_AREA)
        with opencv_log_silent():  # its "FFmpeg: Failed to write frame" warning: our error says it once
            written = self._writer.write(frame)
        if written is False:  # None from OpenCV 4, whose writer reports nothing: the read-back catches it
            # the message first: it says how much space is free, before the work directory's is given back
            message = self._failure(f"OpenCV's writer failed at frame {self.count}; no video written")
            self._abort()
            raise EdgecapError(message)
        self.count += 1

    def _failure(self, what: str) -> str:
        """OpenCV passes on no errno: a disk with less than FULL_BELOW free is taken to be full."""
        free = free_bytes(self.path)
        if free is not None and free < FULL_BELOW:
            return f"cannot write --save-video {self.path}: No space left on device ({free_space(self.path)}): {what}"
        return f"cannot write --save-video {self.path}: {what} ({free_space(self.path)})"

    def _finish(self) -> None:
        """Release the writer and read the file back: it must open and hold every frame."""
        import cv2

        writer, self._writer = self._writer, None
        writer.release()
        capture = cv2.VideoCapture(str(self._work.file()))
        try:
            frames = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) if capture.isOpened() else -1
        finally:
            capture.release()
        if frames != self.count:
            found = "does not open" if frames < 0 else f"holds {frames} of its {self.count} frames"
            raise EdgecapError(self._failure(f"the finished video {found} (FFmpeg could not write it whole); "
                                             "no video written"))

    def _abort(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.release()
        self._work.close()

    def close(self) -> None:
        if self._writer is not None:
            self._work.finish(self._finish)
        else:  # no frame came, or the writer failed: no video, and the claim is dropped
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
