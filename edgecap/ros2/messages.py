"""Message helpers of the node that need no rclpy: the generated class of a type name, message
objects filled from field dicts, the stamped caption marker, and the next caption on demand."""

from __future__ import annotations

import importlib
import threading

from edgecap.ros.images import time_msg
from edgecap.runtime.records import Record

CAPTION_MARKER_TOPIC = "edgecap/caption_marker"
MARKER = "visualization_msgs/msg/Marker"
TEXT_VIEW_FACING, ADD = 9, 0              # visualization_msgs/Marker constants
MARKER_TEXT_HEIGHT = 0.1                  # metres: the height of an uppercase letter in rviz


def relative(topic: str) -> str:
    """The caption log's absolute topic names (edgecap.ros.captions) under the node's namespace."""
    return topic.lstrip("/")


def message_class(typename: str):
    """rclpy's generated class for 'pkg/msg/Name'; ImportError when the package is missing."""
    package, _, name = typename.partition("/msg/")
    return getattr(importlib.import_module(f"{package}.msg"), name)


def filled(msg, fields: dict):
    """`msg` (a generated message object) with `fields` set, nested dicts into nested messages."""
    for name, value in fields.items():
        if isinstance(value, dict):
            filled(getattr(msg, name), value)
        else:
            setattr(msg, name, value)
    return msg


def caption_marker(record: Record, marker_id: int = 0) -> dict:
    """visualization_msgs/Marker fields of one caption: TEXT_VIEW_FACING with the captioned
    image's header (stamp and frame_id), so rviz, Foxglove, bags and message_filters place the
    caption in time with the image. One marker id per camera: each caption replaces the last."""
    header_ns, _ = record.stamps_ns()
    frame_id = record.frame.stamp.frame_id if record.frame.stamp is not None else ""
    return {"header": {"stamp": time_msg(header_ns), "frame_id": frame_id}, "ns": "edgecap",
            "id": marker_id, "type": TEXT_VIEW_FACING, "action": ADD, "text": record.caption.text,
            "pose": {"orientation": {"w": 1.0}}, "scale": {"z": MARKER_TEXT_HEIGHT},
            "color": {"r": 1.0, "g": 1.0, "b": 1.0, "a": 1.0}}


class NextCaption:
    """The `edgecap/caption_now` service's wait: a sink of the loop that hands the next record
    to whoever is waiting (`wait`); `pending` tells the loop to take a frame even while paused."""

    def __init__(self):
        self._cond = threading.Condition()
        self._pending = 0                 # callers waiting for a caption not made yet
        self._serial = 0
        self._record: Record | None = None

    @property
    def pending(self) -> bool:
        return self._pending > 0

    def __call__(self, record: Record) -> None:
        with self._cond:
            if self._pending:  # served: the loop pauses again from its next round, if paused
                self._record, self._serial, self._pending = record, self._serial + 1, 0
                self._cond.notify_all()

    def wait(self, timeout: float, stop: threading.Event) -> Record | None:
        """The next caption's record, or None after `timeout` s (or when `stop` is set)."""
        with self._cond:
            serial = self._serial
            self._pending += 1
            self._cond.wait_for(lambda: self._serial != serial or stop.is_set(), timeout)
            if self._serial != serial:
                return self._record
            self._pending = max(0, self._pending - 1)
            return None

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()
