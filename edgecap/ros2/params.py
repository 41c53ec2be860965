"""The node's parameters: one table of names, defaults, types, bounds and docs (`PARAMS`), the
typed settings object built from it (`NodeParams`, frozen: a change replaces it whole), and
the ROS parameter descriptors with ranges (what rqt_reconfigure shows).

Values are typed leniently, as people write them on a command line or in YAML: a float
parameter takes 5 as 5.0, an int parameter takes 5.0 as 5 (not 5.5), a bool takes true/false
only. Bounds are `edgecap.argtypes` ranges, the same objects as the CLI options a parameter
mirrors (threads as `edgecap run --threads`, max_rate as `--max-fps`), so the node and the CLI
admit the same values. A value outside its bounds or choices is refused with one line naming
the parameter, the value and what was expected. `live` parameters may change while the node
runs (`ros2 param set`); the others are read once at start.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, make_dataclass, replace

from edgecap.argtypes import BEAM, FRACTION, POSITIVE, THREADS, Integer, Number
from edgecap.errors import EdgecapError
from edgecap.runtime.detector import DEFAULT_IOU, DEFAULT_MIN_SCORE

QOS_CHOICES = ("sensor_data", "reliable")
DURABILITY_CHOICES = ("volatile", "transient_local")
DETECTION_FORMATS = ("json", "vision_msgs")
SECONDS = Number(0, 3600)                 # a wait or a tolerance: up to an hour
PERIOD = Number(above=0, high=3600)       # a period: more than nothing, up to an hour
DEPTH = Integer(1, 1000)                  # messages a DDS history keeps (1000 raw 640x480 frames: 0.9 GB)


class ParameterError(EdgecapError):
    """A parameter value of the wrong type or out of range."""


@dataclass(frozen=True)
class Param:
    name: str
    default: object
    kind: type                              # str, int, float or bool
    doc: str
    live: bool = False                      # changeable at run time through the parameter callback
    bounds: Integer | Number | None = None  # numbers: the admitted range (argtypes)
    choices: tuple[str, ...] = field(default=())

    def expected(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.bounds is not None:
            return self.bounds.expected()
        return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}[self.kind]

    def check(self, value):
        """`value` as this parameter's type, or ParameterError."""
        out = _coerce(value, self.kind)
        if out is None or (self.choices and out not in self.choices) or (
                self.bounds is not None and not self.bounds.admits(out)):
            raise ParameterError(f"parameter {self.name}: {value!r} is not {self.expected()}")
        return out

    def descriptor_range(self) -> tuple[str, float, float] | None:
        """("integer_range" | "floating_point_range", from, to) for the ROS descriptor; an open
        upper end is the type's largest value."""
        if self.bounds is None:
            return None
        low = self.bounds.low if self.bounds.low is not None else getattr(self.bounds, "above", None)
        if self.kind is int:
            return "integer_range", int(low or 0), int(self.bounds.high if self.bounds.high is not None else 2**63 - 1)
        return ("floating_point_range", float(low or 0.0),
                float(self.bounds.high if self.bounds.high is not None else sys.float_info.max))


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
    Param("max_rate", 5.0, float, "most captions per second (as edgecap run --max-fps)", live=True,
          bounds=POSITIVE),
    Param("beam", 0, int, "beam width; 0: the bundle's own", live=True, bounds=Integer(0, BEAM.high)),
    Param("enabled", True, bool, "caption (false: pause; frames meanwhile are dropped; the "
          "edgecap/enable service sets it too)", live=True),
    Param("qos", "sensor_data", str, "image subscription: sensor_data (best effort) or reliable",
          choices=QOS_CHOICES),
    Param("qos_depth", 10, int, "messages the image subscription's DDS reader keeps: deep enough to "
          "absorb a transport stall; the node still captions the newest", bounds=DEPTH),
    Param("queue_depth", 1, int, "frames the node keeps waiting for a caption, oldest first (1: "
          "always the newest, fresh captions; N: a burst of N captioned in full, captions lag)",
          bounds=DEPTH),
    Param("output_depth", 10, int, "history depth of the caption publishers", bounds=DEPTH),
    Param("output_durability", "volatile", str, "caption publishers: volatile, or transient_local "
          "(a late subscriber gets the last output_depth captions)", choices=DURABILITY_CHOICES),
    Param("allow_non_colour", False, bool, "caption depth / 16-bit mono images as grey instead of "
          "refusing them"),
    Param("detections_topic", "", str, "objects per frame, for coverage and annotations (empty: none)"),
    Param("detections_format", "json", str, "json (std_msgs/String) or vision_msgs "
          "(vision_msgs/Detection2DArray)", choices=DETECTION_FORMATS),
    Param("stamp_tolerance", 0.05, float, "seconds between an image's and its detections' "
          "header stamps that still match", bounds=SECONDS),
    Param("detections_wait", 0.2, float, "seconds a caption waits for its frame's detections", bounds=SECONDS),
    Param("detections_misses", 5, int, "frames in a row without detections after which captions stop "
          "waiting for them (until detections match again)", bounds=Integer(1, 1_000_000)),
    Param("detector", "", str, "an ONNX object detector (ultralytics YOLO export, ...) run on the "
          "captioned frames, every camera's in one batch; its objects give coverage and annotations "
          "(empty: none; not with detections_topic; as edgecap run --detector)"),
    Param("detector_min_score", DEFAULT_MIN_SCORE, float, "detector: keep boxes scoring at least this (as edgecap run "
          "--min-score)", bounds=FRACTION),
    Param("detector_iou", DEFAULT_IOU, float, "detector: boxes of one class overlapping more are one object (as "
          "edgecap run --nms-iou)", bounds=FRACTION),
    Param("publish_annotated", True, bool, "publish the annotated image (with detections)"),
    Param("no_image_warning", 5.0, float, "seconds without an image before a warning and ERROR in "
          "/diagnostics", bounds=PERIOD),
    Param("stale_periods", 5.0, float, "WARN in /diagnostics when a camera's last image is older "
          "than this many of its own frame periods", bounds=Number(above=1, high=1_000_000)),
    Param("min_rate", 0.0, float, "WARN in /diagnostics when captions/s or a camera's images/s fall "
          "below this (0: off)", live=True, bounds=Number(0, 1000)),
    Param("max_loss", 0.2, float, "WARN in /diagnostics when more than this share of the frames "
          "published in the last 10 s was lost on the way", live=True, bounds=Number(0, 1)),
    Param("diagnostics_period", 1.0, float, "seconds between /diagnostics messages", bounds=PERIOD),
    Param("trigger_timeout", 5.0, float, "seconds the edgecap/caption_now service waits for the next "
          "frame's caption", bounds=PERIOD),
    Param("threads", 0, int, "onnxruntime intra-op threads (0: one per physical core; as edgecap run "
          "--threads)", bounds=THREADS),
    Param("spin", True, bool, "idle onnxruntime threads busy-wait (false: they sleep)"),
)
BY_NAME = {p.name: p for p in PARAMS}

NodeParams = make_dataclass("NodeParams", [(p.name, p.kind) for p in PARAMS], frozen=True)
NodeParams.__doc__ = "The node's parameters, checked (PARAMS); replaced whole on a change."


def check_all(values: dict) -> NodeParams:
    """The checked parameters (missing ones at their defaults); ParameterError on the first bad one."""
    return NodeParams(**{p.name: p.check(values.get(p.name, p.default)) for p in PARAMS})


def changed(params: NodeParams, values: dict) -> NodeParams:
    """`params` with `values` ({name: raw value}) checked and applied, all or none."""
    return replace(params, **{name: BY_NAME[name].check(value) for name, value in values.items()})
