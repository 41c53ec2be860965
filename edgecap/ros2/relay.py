"""One image message in, a Frame out: the node's conversion of what its subscription receives,
so it runs without ROS 2 too (the node's newest-frame slot, frames.py, calls it).

Depth and other measurement images (NON_COLOUR) are refused unless allowed: captioned as grey
they give confident captions of nothing. Undecodable messages are skipped and counted.
"""

from __future__ import annotations

import time

from edgecap.errors import EdgecapError
from edgecap.ros.images import ImageDecodeError, UnsupportedImage
from edgecap.runtime.camera import Frame
from edgecap.runtime.sources import logged_image

# sensor_msgs/image_encodings whose values are measurements (depth in mm, thermal counts), not
# light a captioner was trained on; 32FC1 (depth in m) is not readable at all
NON_COLOUR = frozenset({"16UC1", "mono16", "32FC1"})


class Refused(EdgecapError):
    """A frame in an encoding the node will not caption (the whole stream, usually)."""


class CaptionRelay:
    """Image messages of one topic as Frames (numbered in arrival order)."""

    def __init__(self, msgtype: str, allow_non_colour: bool = False):
        self.msgtype = msgtype
        self.allow_non_colour = allow_non_colour
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


__all__ = ["CaptionRelay", "ImageDecodeError", "NON_COLOUR", "Refused"]
