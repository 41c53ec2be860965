"""The caption track as ROS 2 messages (dicts of fields), shared by the MCAP sink and the ROS 2
node:

    /edgecap/caption      std_msgs/msg/String                the caption text
    /edgecap/record       std_msgs/msg/String                the JSON record (latency, coverage)
    /edgecap/annotations  foxglove_msgs/msg/ImageAnnotations boxes of the known objects, coloured
                                                             by whether the caption names them,
                                                             and the caption as text

Every message of one caption carries the captioned image's header stamp (the annotations in their
`timestamp` fields; the log writer also uses it for log time), so Foxglove draws the
annotations on exactly the image they belong to.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from dataclasses import dataclass

from .images import time_msg

# foxglove_msgs/msg/* as in the foxglove_msgs ROS 2 package since 3.2.5 (March 2026; comments left
# out): ImageAnnotations gained a `timestamp` first and every annotation type a trailing
# `metadata` list. Field order is the CDR layout, so a node built against the installed package
# decodes what `ros2 bag play` sends only when these lists are the package's exactly
# (tests/test_ros_foxglove.py compares them with @foxglove/schemas' definitions).
FOXGLOVE_MSGS = {
    "foxglove_msgs/msg/Point2": "float64 x\nfloat64 y\n",
    "foxglove_msgs/msg/Color": "float64 r\nfloat64 g\nfloat64 b\nfloat64 a\n",
    "foxglove_msgs/msg/KeyValuePair": "string key\nstring value\n",
    "foxglove_msgs/msg/CircleAnnotation": (
        "builtin_interfaces/Time timestamp\nfoxglove_msgs/Point2 position\nfloat64 diameter\n"
        "float64 thickness\nfoxglove_msgs/Color fill_color\nfoxglove_msgs/Color outline_color\n"
        "foxglove_msgs/KeyValuePair[] metadata\n"),
    "foxglove_msgs/msg/PointsAnnotation": (
        "builtin_interfaces/Time timestamp\nuint8 UNKNOWN=0\nuint8 POINTS=1\nuint8 LINE_LOOP=2\n"
        "uint8 LINE_STRIP=3\nuint8 LINE_LIST=4\nuint8 type\nfoxglove_msgs/Point2[] points\n"
        "foxglove_msgs/Color outline_color\nfoxglove_msgs/Color[] outline_colors\n"
        "foxglove_msgs/Color fill_color\nfloat64 thickness\n"
        "foxglove_msgs/KeyValuePair[] metadata\n"),
    "foxglove_msgs/msg/TextAnnotation": (
        "builtin_interfaces/Time timestamp\nfoxglove_msgs/Point2 position\nstring text\n"
        "float64 font_size\nfoxglove_msgs/Color text_color\nfoxglove_msgs/Color background_color\n"
        "foxglove_msgs/KeyValuePair[] metadata\n"),
    "foxglove_msgs/msg/ImageAnnotations": (
        "builtin_interfaces/Time timestamp\nfoxglove_msgs/CircleAnnotation[] circles\n"
        "foxglove_msgs/PointsAnnotation[] points\nfoxglove_msgs/TextAnnotation[] texts\n"
        "foxglove_msgs/KeyValuePair[] metadata\n"),
}
# What 3.2.5 added, per type: a robot with an older foxglove_msgs installed publishes without it.
ADDED_IN_3_2_5 = {
    "foxglove_msgs/msg/ImageAnnotations": frozenset({"timestamp", "metadata"}),
    **{f"foxglove_msgs/msg/{kind}Annotation": frozenset({"metadata"})
       for kind in ("Circle", "Points", "Text")},
}

STRING = "std_msgs/msg/String"
ANNOTATIONS = "foxglove_msgs/msg/ImageAnnotations"
CAPTION_TOPIC = "/edgecap/caption"
RECORD_TOPIC = "/edgecap/record"
ANNOTATIONS_TOPIC = "/edgecap/annotations"
LINE_LOOP = 2                              # foxglove_msgs/PointsAnnotation.LINE_LOOP
WHITE = (1.0, 1.0, 1.0, 1.0)
BACKDROP = (0.0, 0.0, 0.0, 0.6)
CLEAR = (0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Box:
    """One object to outline: an inclusive pixel box, a label, an RGBA colour (0..1), and
    (key, value) pairs for the annotations' `metadata` lists (its class, whether it is named)."""

    left: float
    top: float
    right: float
    bottom: float
    label: str
    rgba: tuple[float, float, float, float]
    thickness: float = 2.0
    metadata: tuple[tuple[str, str], ...] = ()


def string_msg(text: str) -> dict:
    return {"data": str(text)}


def record_msg(record: dict) -> dict:
    return string_msg(json.dumps(record, ensure_ascii=False, separators=(",", ":")))


def _color(rgba) -> dict:
    r, g, b, a = rgba
    return {"r": float(r), "g": float(g), "b": float(b), "a": float(a)}


def _point(x: float, y: float) -> dict:
    return {"x": float(x), "y": float(y)}


def _pairs(metadata) -> list[dict]:
    return [{"key": str(key), "value": str(value)} for key, value in metadata]


def _text(stamp: dict, x: float, y: float, text: str, size: float, rgba, backdrop,
          metadata=()) -> dict:
    return {"timestamp": stamp, "position": _point(x, y), "text": text, "font_size": float(size),
            "text_color": _color(rgba), "background_color": _color(backdrop),
            "metadata": _pairs(metadata)}


def image_annotations(stamp_ns: int, width: int, boxes: list[Box], caption: str | None) -> dict:
    """foxglove_msgs/ImageAnnotations fields: one closed outline and label per box, each with
    the box's metadata pairs, and the caption wrapped into lines at the image's top-left.

    Foxglove's image coordinates put the origin at the top-left corner of the top-left pixel,
    so the inclusive box [l, r] x [t, b] covers l .. r + 1 and t .. b + 1.
    """
    stamp = time_msg(stamp_ns)
    font = max(4.0, width / 32.0)          # scales with the image, as Foxglove zooms it
    points, texts = [], []
    for box in boxes:
        left, top, right, bottom = box.left, box.top, box.right + 1, box.bottom + 1
        points.append({"timestamp": stamp, "type": LINE_LOOP,
                       "points": [_point(left, top), _point(right, top), _point(right, bottom),
                                  _point(left, bottom)],
                       "outline_color": _color(box.rgba), "outline_colors": [],
                       "fill_color": _color(CLEAR), "thickness": float(box.thickness),
                       "metadata": _pairs(box.metadata)})
        texts.append(_text(stamp, left, max(top - 1, font), box.label, font * 0.8, box.rgba,
                           BACKDROP, box.metadata))
    if caption is not None:
        chars = max(16, int(width / (0.55 * font)))
        for i, line in enumerate(textwrap.wrap(caption or "(empty caption)", chars)):
            texts.append(_text(stamp, 2, font * (i + 1.2), line, font, WHITE, BACKDROP))
    return {"timestamp": stamp, "circles": [], "points": points, "texts": texts, "metadata": []}


def caption_messages(stamp_ns: int, width: int, caption: str, record: dict,
                     boxes: list[Box] | None) -> list[tuple[str, str, dict]]:
    """(topic, type, fields) of one caption; annotations only when objects are known."""
    out = [(CAPTION_TOPIC, STRING, string_msg(caption)),
           (RECORD_TOPIC, STRING, record_msg(record))]
    if boxes is not None:
        out.append((ANNOTATIONS_TOPIC, ANNOTATIONS,
                    image_annotations(stamp_ns, width, boxes, caption)))
    return out


def field_types(typename: str) -> dict[str, str]:
    """{field: message type} of a foxglove_msgs type's message-valued fields, from its
    definition above (builtin_interfaces/Time included)."""
    out = {}
    for line in FOXGLOVE_MSGS.get(typename, "").splitlines():
        kind, _, name = line.partition(" ")
        if "=" in name or "/" not in kind:
            continue
        package, _, base = kind.removesuffix("[]").partition("/")
        out[name] = f"{package}/msg/{base}"
    return out


def declared_fields(cls) -> set[str] | None:
    """Field names of a message class: rclpy's generated classes list them, rosbags' are
    dataclasses; None when the class does not say."""
    listed = getattr(cls, "get_fields_and_field_types", None)
    if listed is not None:
        return set(listed())
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return None


def to_ros(fields: dict, typename: str, message_class):
    """Message objects from the dicts above: `message_class(typename)` gives the class (rclpy's
    generated ones on a robot, rosbags' in the tests); nested fields become nested messages.
    Fields foxglove_msgs 3.2.5 added are left out when the installed package predates them."""
    cls = message_class(typename)
    nested = field_types(typename)
    declared = declared_fields(cls)
    newer = ADDED_IN_3_2_5.get(typename, frozenset())
    kwargs = {}
    for name, value in fields.items():
        if name in newer and declared is not None and name not in declared:
            continue
        sub = nested.get(name)
        if sub is None:
            kwargs[name] = value
        elif isinstance(value, list):
            kwargs[name] = [to_ros(v, sub, message_class) for v in value]
        else:
            kwargs[name] = to_ros(value, sub, message_class)
    return cls(**kwargs)
