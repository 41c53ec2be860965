"""Objects from the ROS graph, matched to camera frames by header stamp.

Two message kinds carry them:

  json         std_msgs/msg/String whose data is one object like a `--detections` line, stamped
               with the camera image it belongs to:
               {"stamp": {"sec": S, "nanosec": N}, "objects": [{"class": "cup",
                "box": [left, top, right, bottom], "area"?: 0.03}, ...]}
               ("stamp_ns": int is accepted for the stamp)
  vision_msgs  vision_msgs/msg/Detection2DArray (vision_msgs 4.x; 3.x's bbox.center.x and
               results[].id are read too): the class is the best-scoring hypothesis' class_id

`StampedObjects` keeps the newest few sets and hands a frame the one whose stamp is nearest to the
frame's header stamp within a tolerance, waiting a little for detections that arrive after the
image (a detector usually runs on the same image and publishes later).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque

from edgecap.contract.objects import KnownObject, objects_in_view
from edgecap.data.classes import canonical_class
from edgecap.errors import EdgecapError

# (class, (left, top, right, bottom), mask area or None): a KnownObject once the frame's size is known
RawObject = tuple[str, tuple[float, float, float, float], "float | None"]


def json_objects(text: str) -> tuple[int, list[RawObject]]:
    """(stamp ns, objects) of one JSON detections message; EdgecapError naming what is wrong."""
    from edgecap.runtime.detections import parse_object

    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise EdgecapError(f"detections message is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise EdgecapError(f"detections message: expected an object, got {type(doc).__name__}")
    stamp = doc.get("stamp_ns")
    if stamp is None and isinstance(doc.get("stamp"), dict):
        sec, nanosec = doc["stamp"].get("sec"), doc["stamp"].get("nanosec", 0)
        if isinstance(sec, int) and isinstance(nanosec, int):
            stamp = sec * 1_000_000_000 + nanosec
    if not isinstance(stamp, int) or isinstance(stamp, bool):
        raise EdgecapError("detections message: missing 'stamp' {sec, nanosec} (or 'stamp_ns')")
    objects = doc.get("objects")
    if not isinstance(objects, list):
        raise EdgecapError("detections message: 'objects' must be a list")
    return stamp, [parse_object(obj, f"detections object {i}") for i, obj in enumerate(objects)]


def vision_objects(msg) -> tuple[int, list[RawObject]]:
    """(stamp ns, objects) of a vision_msgs/Detection2DArray (any object with its fields)."""
    from edgecap.ros.images import stamp_ns

    objects = []
    for det in msg.detections:
        if not det.results:
            continue
        best = max(det.results, key=lambda r: _hypothesis(r)[1])
        center = det.bbox.center
        x, y = (center.position.x, center.position.y) if hasattr(center, "position") else (center.x, center.y)
        w, h = det.bbox.size_x, det.bbox.size_y
        box = (float(x - w / 2), float(y - h / 2), float(x + w / 2), float(y + h / 2))
        objects.append((canonical_class(_hypothesis(best)[0]), box, None))
    return stamp_ns(msg.header.stamp), objects


def _hypothesis(result) -> tuple[str, float]:
    hyp = getattr(result, "hypothesis", result)            # 4.x nests it; 3.x has id / score
    return str(getattr(hyp, "class_id", getattr(hyp, "id", ""))), float(hyp.score)


class StampedObjects:
    """The newest `keep` detection sets by stamp; `match` finds a frame's (thread-safe)."""

    def __init__(self, keep: int = 64):
        self._sets: deque[tuple[int, list[RawObject]]] = deque(maxlen=keep)
        self._cond = threading.Condition()
        self._closed = False
        self.received = 0
        self.matched = 0
        self.unmatched = 0
        self.outside = 0                            # boxes with no part inside their frame: left out
        self.last_received: float | None = None     # time.monotonic() of the newest set

    def add(self, stamp_ns: int, objects: list[RawObject]) -> None:
        with self._cond:
            self._sets.append((stamp_ns, objects))
            self.received += 1
            self.last_received = time.monotonic()
            self._cond.notify_all()

    def close(self) -> None:
        """End every wait now (the node is stopping)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _nearest(self, stamp_ns: int, tolerance_ns: int):
        best = min(self._sets, key=lambda s: abs(s[0] - stamp_ns), default=None)
        return best[1] if best is not None and abs(best[0] - stamp_ns) <= tolerance_ns else None

    def match(self, stamp_ns: int, tolerance_s: float, wait_s: float = 0.0) -> list[RawObject] | None:
        """The objects whose stamp is nearest `stamp_ns` within the tolerance, waiting up to
        `wait_s` for them to arrive; None when none do."""
        tolerance_ns = int(round(tolerance_s * 1e9))
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._nearest(stamp_ns, tolerance_ns) is not None, wait_s)
            found = self._nearest(stamp_ns, tolerance_ns)
            if found is None:
                self.unmatched += 1
            else:
                self.matched += 1
            return found

    def report(self) -> dict:
        return {"received": self.received, "matched_frames": self.matched,
                "unmatched_frames": self.unmatched, "boxes_outside_frame": self.outside}


class DetectionMatcher:
    """The loop's `annotate_objects(frames)` for a detections topic: each frame's objects (or
    None), waiting at most `wait_s` for a detector that publishes after the image. After
    `misses` frames in a row without a match it stops waiting, so a dead or lagging detector
    never slows captioning; it waits again as soon as a frame matches. Boxes are clipped to the
    frame as a --detections file's are (`objects_in_view`); one wholly outside is left out and
    counted."""

    def __init__(self, objects: StampedObjects, settings, log=None):
        self.objects = objects
        self.settings = settings            # () -> the node's parameters (read at every frame)
        self.log = log or (lambda msg: None)
        self.misses = 0                     # frames in a row without a match
        self.waiting = True

    def __call__(self, frames) -> list[list[KnownObject] | None]:
        return [self.frame_objects(frame) for frame in frames]

    def frame_objects(self, frame) -> list[KnownObject] | None:
        params = self.settings()
        found = self.objects.match(frame.stamp.header_ns, params.stamp_tolerance,
                                   params.detections_wait if self.waiting else 0.0)
        if found is None:
            self.misses += 1
            if self.waiting and self.misses >= params.detections_misses:
                self.waiting = False
                self.log(f"no detections matched the last {self.misses} frames: captioning on without "
                         "waiting for them until they match again")
            return None
        if not self.waiting:
            self.log(f"detections match again after {self.misses} frames without")
        self.misses, self.waiting = 0, True
        height, width = frame.image.shape[:2]
        objects, outside = objects_in_view(found, width, height)
        self.objects.outside += outside
        return objects

    def health(self, now: float) -> dict[str, str]:
        """Diagnostics key-values: matched share, age of the newest set, whether captions wait."""
        report = self.objects.report()
        frames = report["matched_frames"] + report["unmatched_frames"]
        last = self.objects.last_received
        return {**{f"detections_{k}": str(v) for k, v in report.items()},
                "detections_matched_share": "-" if not frames else f"{report['matched_frames'] / frames:.2f}",
                "detections_age_s": "-" if last is None else f"{now - last:.1f}",
                "detections_waiting": str(self.waiting).lower()}
