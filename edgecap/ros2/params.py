"""The node's parameters: one table of names, defaults, types and bounds, and their checks.

Values are typed leniently, as people write them on a command line or in YAML: a float
parameter takes 5 as 5.0, an int parameter takes 5.0 as 5 (not 5.5), a bool takes true/false
only. A value outside its bounds or choices is refused with one line naming the parameter, the
value and what was expected. `live` parameters may change while the node runs (`ros2 param set`);
the others are read once at start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from edgecap.errors import EdgecapError

QOS_CHOICES = ("sensor_data", "reliable")
DETECTION_FORMATS = ("json", "vision_msgs")


class ParameterError(EdgecapError):
    """A parameter value of the wrong type or out of range."""


@dataclass(frozen=True)
class Param:
    name: str
    default: object
    kind: type                              # str, int, float or bool
    doc: str
    live: bool = False                      # changeable at run time through the parameter callback
    low: float | None = None                # inclusive bounds for numbers
    above: float | None = None              # exclusive lower bound for numbers
    choices: tuple[str, ...] = field(default=())

    def expected(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        what = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}[self.kind]
        if self.above is not None:
            what += f" > {self.above:g}"
        elif self.low is not None:
            what += f" >= {self.low:g}"
        return what

    def check(self, value):
        """`value` as this parameter's type, or ParameterError."""
        out = _coerce(value, self.kind)
        if out is None:
            raise ParameterError(f"parameter {self.name}: {value!r} is not {self.expected()}")
        if self.choices and out not in self.choices:
            raise ParameterError(f"parameter {self.name}: {value!r} is not {self.expected()}")
        if self.kind in (int, float) and ((self.low is not None and out < self.low)
                                          or (self.above is not None and out <= self.above)):
            raise ParameterError(f"parameter {self.name}: {value!r} is not {self.expected()}")
        return out


def _coerce(value, kind: type):
    if kind is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if kind is str:
        return value if isinstance(value, str) else None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if kind is int:
        return int(value) if float(value).is_integer() else None
    return float(value)


PARAMS: tuple[Param, ...] = (
    Param("bundle", "", str, "bundle directory (edgecap export --out)"),
    Param("image_topic", "image_raw", str, "image topic, relative to the node's namespace unless it "
          "starts with /"),
    Param("image_topics", "", str, "several image topics, comma-separated, captioned together as "
          "one batch (up to the bundle's batch size at a time); each camera's captions go to "
          "edgecap/... beside its topic; overrides image_topic"),
    Param("compressed", False, bool, "image_topic carries sensor_msgs/CompressedImage (jpeg, png)"),
    Param("max_rate", 5.0, float, "most captions per second", live=True, above=0.0),
    Param("beam", 0, int, "beam width; 0: the bundle's own", live=True, low=0),
    Param("qos", "sensor_data", str, "image subscription: sensor_data (best effort) or reliable",
          choices=QOS_CHOICES),
    Param("qos_depth", 1, int, "frames the subscription and the node's queue keep; the oldest is "
          "dropped when full (1: always the newest)", low=1),
    Param("allow_non_colour", False, bool, "caption depth / 16-bit mono images as grey instead of "
          "refusing them"),
    Param("detections_topic", "", str, "objects per frame, for coverage and annotations (empty: none)"),
    Param("detections_format", "json", str, "json (std_msgs/String) or vision_msgs "
          "(vision_msgs/Detection2DArray)", choices=DETECTION_FORMATS),
    Param("stamp_tolerance", 0.05, float, "seconds between an image's and its detections' "
          "header stamps that still match", low=0.0),
    Param("detections_wait", 0.2, float, "seconds a caption waits for its frame's detections", low=0.0),
    Param("detector", "", str, "an ONNX object detector (ultralytics YOLO export, ...) run on the "
          "captioned frames, every camera's in one batch; its objects give coverage and annotations "
          "(empty: none; not with detections_topic)"),
    Param("detector_min_score", 0.25, float, "detector: keep boxes scoring at least this", low=0.0),
    Param("detector_iou", 0.45, float, "detector: boxes of one class overlapping more are one object",
          low=0.0),
    Param("publish_annotated", True, bool, "publish the annotated image (with detections)"),
    Param("no_image_warning", 5.0, float, "seconds without an image before one warning", above=0.0),
    Param("diagnostics_period", 1.0, float, "seconds between /diagnostics messages", above=0.0),
    Param("threads", 0, int, "onnxruntime intra-op threads (0: one per physical core)", low=0),
    Param("spin", True, bool, "idle onnxruntime threads busy-wait (false: they sleep)"),
)
BY_NAME = {p.name: p for p in PARAMS}


def check_all(values: dict) -> dict:
    """{name: checked value} for every parameter; ParameterError on the first bad one."""
    return {p.name: p.check(values.get(p.name, p.default)) for p in PARAMS}
