"""`--rerun FILE.rrd`: the same picture as the MCAP caption log, as a rerun recording.

Per caption, on the `image_log_time` timeline (the image's log time, as in the MCAP log; rerun
keeps its own `log_time`, the wall clock of the write) and the
`frame` sequence: the image (JPEG-encoded, to keep the file small), the known objects' boxes
coloured as in the video overlay, the caption as a text log, and capture-to-caption latency and
coverage as scalars to plot. rerun-sdk is an optional extra (`edgecap[rerun]`), imported here
only. The recording is saved in a work directory beside FILE (`edgecap.io.WorkDir`) and renamed
when the run ends; an existing FILE is replaced only when it is a recording of application
"edgecap".
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError, require
from edgecap.io import RunOutput, probe_writable

from .records import Record

APPLICATION = "edgecap"


def _written_by_edgecap(path: Path) -> bool:
    try:
        from rerun.chunk import RrdReader

        return any(r.application_id == APPLICATION for r in RrdReader(path).recordings())
    except Exception:  # not an rrd, or one this rerun cannot read: not ours to replace
        return False


def check_target(path: str | os.PathLike) -> Path:
    path = Path(path)
    require("rerun", "rerun", "writing rerun recordings")
    if path.exists() and not path.is_dir() and not _written_by_edgecap(path):
        raise EdgecapError(f"--rerun {path} exists and is not a rerun recording written by "
                           "edgecap; not overwriting it (remove it or choose another path)")
    probe_writable(path, "--rerun", file=True)
    return path


class RerunSink(RunOutput):
    def __init__(self, path: str | os.PathLike, source: str = ""):
        rr = require("rerun", "rerun", "writing rerun recordings")
        self.rr = rr
        self.path = check_target(path)
        super().__init__(self.path, "--rerun")
        self.rec = rr.RecordingStream(APPLICATION)
        try:
            self.rec.save(str(self.tmp))
        except Exception as exc:
            self._work.close()
            raise EdgecapError(f"--rerun {self.path}: cannot write ({exc})") from None
        self.rec.log("source", rr.TextDocument(source), static=True)
        self.count = 0

    def write(self, record: Record) -> None:
        import cv2

        from .overlay import object_marks

        rr, rec, frame = self.rr, self.rec, record.frame
        _, log_ns = record.stamps_ns()
        rec.set_time("image_log_time", timestamp=np.datetime64(log_ns, "ns"))
        rec.set_time("frame", sequence=frame.frame_id)
        ok, jpeg = cv2.imencode(".jpg", frame.image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        if ok:
            rec.log("camera/image", rr.EncodedImage(contents=jpeg.tobytes(), media_type="image/jpeg"))
        marks = object_marks(record)
        if marks:
            rec.log("camera/image/objects", rr.Boxes2D(
                array=[[o.box[0], o.box[1], o.box[2] + 1, o.box[3] + 1] for o, _, _, _ in marks],
                array_format=rr.Box2DFormat.XYXY,
                colors=[(r, g, b) for _, _, (b, g, r), _ in marks],
                labels=[label for _, label, _, _ in marks]))
        else:
            rec.log("camera/image/objects", rr.Clear(recursive=False))
        rec.log("caption", rr.TextLog(record.caption.text))
        rec.log("latency/capture_to_caption_ms", rr.Scalars(record.capture_to_caption_ms))
        for threshold, value in (record.coverage or {}).items():
            if value is not None:
                rec.log(f"coverage/{threshold.lstrip('>').rstrip('%')}pct", rr.Scalars(value))
        self.count += 1

    def _finish_file(self) -> None:
        self.rec.flush()
        self.rec.disconnect()  # writes the footer and closes the file
