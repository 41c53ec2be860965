"""One image message in, a caption record and the messages to publish out: everything the node
does between rclpy's callback and its publishers, so it runs without ROS 2 too.

Depth and other measurement images (NON_COLOUR) are refused unless allowed: captioned as grey
they give confident captions of nothing. Undecodable messages are skipped and counted.
"""

from __future__ import annotations

import time

from edgecap.errors import EdgecapError
from edgecap.ros.images import ImageDecodeError, UnsupportedImage
from edgecap.runtime.camera import Frame
from edgecap.runtime.records import Record
from edgecap.runtime.sources import KnownObject, logged_image

# sensor_msgs/image_encodings whose values are measurements (depth in mm, thermal counts), not
# light a captioner was trained on; 32FC1 (depth in m) is not readable at all
NON_COLOUR = frozenset({"16UC1", "mono16", "32FC1"})


class Refused(EdgecapError):
    """A frame in an encoding the node will not caption (the whole stream, usually)."""


class CaptionRelay:
    def __init__(self, captioner, msgtype: str, source: str, allow_non_colour: bool = False,
                 coverage=None):
        self.captioner = captioner
        self.msgtype = msgtype
        self.source = source
        self.allow_non_colour = allow_non_colour
        self.coverage = coverage                   # runtime.scoring.CoverageAnnotator or None
        self.count = 0

    def frame(self, msg, received: float, received_ns: int) -> Frame:
        """The message as a Frame; ImageDecodeError (skip this one) or Refused."""
        encoding = getattr(msg, "encoding", None)
        if encoding in NON_COLOUR and not self.allow_non_colour:
            raise Refused(f"image encoding {encoding!r} is not a colour image (depth or other "
                          "measurements); set allow_non_colour:=true to caption it as grey")
        try:
            image, stamp = logged_image(msg, self.msgtype, received_ns)
        except UnsupportedImage as exc:
            raise Refused(str(exc)) from None
        frame = Frame(image, self.count, received, received_ns / 1e9, stamp=stamp,
                      t_taken=time.monotonic())
        self.count += 1
        return frame

    @staticmethod
    def attach(frame: Frame, objects) -> None:
        """Give the frame its detections ((class, box, mask area) triples), areas by its size."""
        if objects is not None:
            height, width = frame.image.shape[:2]
            frame.objects = [KnownObject.measured(cls, box, area, width, height)
                             for cls, box, area in objects]

    def caption(self, frames: list[Frame], beam: int | None,
                sources: list[str] | None = None) -> list[Record]:
        """Caption the frames as one batch (or as many as the bundle's batch takes), then score
        the coverage of those with objects. `sources`: each frame's camera (default: ours)."""
        captions = self.captioner.caption([f.image for f in frames], beam=beam)
        done = time.monotonic()
        records = []
        for i, (frame, caption) in enumerate(zip(frames, captions, strict=True)):
            record = Record(frame, caption, sources[i] if sources else self.source, done)
            scored = self.coverage.score(caption.text, frame.objects) if self.coverage else None
            if scored is not None:
                record.coverage, record.matches = scored
            records.append(record)
        return records


__all__ = ["CaptionRelay", "ImageDecodeError", "NON_COLOUR", "Refused"]
