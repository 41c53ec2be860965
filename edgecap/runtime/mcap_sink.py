"""`--out-mcap FILE`: the caption track as an MCAP log beside the input log.

Per captioned frame (topics and types in edgecap.ros.captions): the caption on
/edgecap/caption, the JSON record on /edgecap/record, and, when objects are known (ground
truth or --detections), foxglove_msgs/ImageAnnotations on /edgecap/annotations. All of them
are logged at the captioned image's own log time and carry its header stamp, so the caption
log opened together with the input log in Foxglove lines up with the camera, message for
message. Frames from a camera (no log) use their capture wall time for both.
"""

from __future__ import annotations

import os
import time

from .records import Record


def record_messages(record: Record) -> tuple[int, list[tuple[str, str, dict]]]:
    """(log time ns, [(topic, type, fields)]) of one caption: what the MCAP sink writes and the
    ROS 2 node (robot/ros2_caption_node.py) publishes."""
    from edgecap.ros.captions import Box, caption_messages

    frame = record.frame
    header_ns, log_ns = record.stamps_ns()
    boxes = None
    if frame.objects is not None:
        from .overlay import MENTION_BY_COLOUR, object_marks

        boxes = [Box(*obj.box, label, (b / 255.0, g / 255.0, r / 255.0, 1.0), float(thick),
                     (("class", obj.cls), ("mention", MENTION_BY_COLOUR[(b, g, r)])))
                 for obj, label, (b, g, r), thick in object_marks(record)]
    return log_ns, caption_messages(header_ns, frame.image.shape[1], record.caption.text,
                                    record.to_json(), boxes)


class McapCaptionSink:
    """`write(record)` appends one caption's messages; `close()` finishes the file."""

    def __init__(self, path: str | os.PathLike, source: str = "", bundle: str = ""):
        from edgecap.ros.mcap_out import McapLogWriter

        self.writer = McapLogWriter(path, "--out-mcap", {
            "source": source, "bundle": bundle, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        self.path = self.writer.path
        self.count = 0

    def write(self, record: Record) -> None:
        self.write_messages(*record_messages(record))

    def write_messages(self, log_ns: int, messages: list[tuple[str, str, dict]]) -> None:
        """One caption's messages as `record_messages` made them (edgecap fleet makes them in
        its caption actors and writes them here, in the driver)."""
        for topic, typename, fields in messages:
            self.writer.write(topic, typename, fields, log_ns)
        self.count += 1

    def close(self) -> None:
        self.writer.close()
