"""sensor_msgs/msg/Image and sensor_msgs/msg/CompressedImage <-> OpenCV BGR frames.

Works on any object with the messages' fields as attributes: messages decoded by rosbags or
mcap-ros2-support, and rclpy's own (robot/ros2_caption_node.py). Raw encodings follow
sensor_msgs/image_encodings.hpp (colour, mono, Bayer, packed YUV 4:2:2 and planar NV12 / NV21;
NV24 and 16-bit colour are refused by name); 16-bit mono images map their full range onto 8 bits
(v * 255 / 65535), as cv_bridge's depth conversion does, so no frame is stretched by its own
contents. CompressedImage `format` is image_transport's ("jpeg", "png", or
"bgr8; jpeg compressed bgr8"): jpeg and png are decoded; others (compressedDepth, h264) are
refused by name.
"""

from __future__ import annotations

import numpy as np

from edgecap.errors import EdgecapError
from edgecap.image_damage import damage

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED = "sensor_msgs/msg/CompressedImage"
IMAGE_TYPES = (IMAGE, COMPRESSED)

# encoding -> (bytes per channel value, channels, OpenCV conversion to BGR or None)
_RAW = {
    "bgr8": (1, 3, None),
    "rgb8": (1, 3, "COLOR_RGB2BGR"),
    "bgra8": (1, 4, "COLOR_BGRA2BGR"),
    "rgba8": (1, 4, "COLOR_RGBA2BGR"),
    "mono8": (1, 1, "COLOR_GRAY2BGR"),
    "8UC1": (1, 1, "COLOR_GRAY2BGR"),
    "8UC3": (1, 3, None),                 # cv_bridge treats 8UC3 as BGR
    "mono16": (2, 1, "COLOR_GRAY2BGR"),
    "16UC1": (2, 1, "COLOR_GRAY2BGR"),
    # Packed YUV 4:2:2 (8 bits, BT.601 video range, as cv_bridge converts it): UYVY cameras
    # (GMSL, many industrial ones; `yuv422` is its older name) and YUYV webcams (usb_cam,
    # v4l2_camera; `yuv422_yuy2`). Two bytes per pixel; OpenCV needs an even width.
    "uyvy": (1, 2, "COLOR_YUV2BGR_UYVY"),
    "yuv422": (1, 2, "COLOR_YUV2BGR_UYVY"),
    "yuyv": (1, 2, "COLOR_YUV2BGR_YUYV"),
    "yuv422_yuy2": (1, 2, "COLOR_YUV2BGR_YUYV"),
    # Planar YUV 4:2:0 (Jetson / Isaac ROS cameras): `height` rows of Y, then height / 2 rows of
    # interleaved chroma (U V for nv12, V U for nv21), each `step` bytes.
    "nv12": (1, 1, "COLOR_YUV2BGR_NV12"),
    "nv21": (1, 1, "COLOR_YUV2BGR_NV21"),
    # Bayer mosaics: OpenCV names a pattern by its second row, so RGGB is BayerBG.
    "bayer_rggb8": (1, 1, "COLOR_BayerBG2BGR"),
    "bayer_bggr8": (1, 1, "COLOR_BayerRG2BGR"),
    "bayer_gbrg8": (1, 1, "COLOR_BayerGR2BGR"),
    "bayer_grbg8": (1, 1, "COLOR_BayerGB2BGR"),
}
RAW_ENCODINGS = tuple(_RAW)
_HALF_CHROMA = ("nv12", "nv21")            # stored as height * 3 / 2 rows
COMPRESSED_FORMATS = ("jpeg", "png")


class UnsupportedImage(EdgecapError):
    """A whole topic the runtime cannot read: an encoding or compression it does not know."""


class ImageDecodeError(ValueError):
    """One message that does not decode (truncated data, a corrupt JPEG): skip it."""


def _where(msg) -> str:
    header = getattr(msg, "header", None)
    stamp = getattr(header, "stamp", None)
    if stamp is None:
        return "image"
    return f"image stamped {stamp.sec}.{stamp.nanosec:09d}"


def image_to_bgr(msg) -> np.ndarray:
    """A sensor_msgs/Image as an HxWx3 uint8 BGR array (a copy: the message may be reused)."""
    import cv2

    encoding = str(msg.encoding)
    layout = _RAW.get(encoding)
    if layout is None:
        raise UnsupportedImage(f"image encoding {encoding!r} is not supported; expected one of "
                               f"{', '.join(RAW_ENCODINGS)}")
    depth, channels, conversion = layout
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    row_bytes = width * channels * depth
    data = np.frombuffer(msg.data, np.uint8)
    if height <= 0 or width <= 0:
        raise ImageDecodeError(f"{_where(msg)}: empty image ({width}x{height})")
    if channels == 2 and width % 2:
        raise ImageDecodeError(f"{_where(msg)}: {encoding} needs an even width, not {width}")
    stored = height
    if encoding in _HALF_CHROMA:
        if width % 2 or height % 2:
            raise ImageDecodeError(f"{_where(msg)}: {encoding} needs an even width and height, "
                                   f"not {width}x{height}")
        stored = height * 3 // 2
    if step < row_bytes or data.size < step * (stored - 1) + row_bytes:
        raise ImageDecodeError(f"{_where(msg)}: {data.size} bytes with step {step} cannot hold "
                               f"{width}x{height} {encoding}")
    if data.size < step * stored:  # the last row may omit its padding
        data = np.concatenate([data, np.zeros(step * stored - data.size, np.uint8)])
    rows = data[: step * stored].reshape(stored, step)[:, :row_bytes]
    if depth == 2:
        order = ">" if int(getattr(msg, "is_bigendian", 0)) else "<"
        wide = np.ascontiguousarray(rows).view(f"{order}u2").reshape(height, width)
        plane = ((wide.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
    else:
        plane = rows.reshape(height, width, channels) if channels > 1 else rows
    if conversion is None:
        return np.ascontiguousarray(plane)
    return cv2.cvtColor(np.ascontiguousarray(plane), getattr(cv2, conversion))


def compressed_kind(fmt: str) -> str:
    """'jpeg' or 'png' from a CompressedImage format string; UnsupportedImage otherwise."""
    text = str(fmt).lower()
    if "compresseddepth" in text:
        kind = None
    elif "jpeg" in text or "jpg" in text:
        kind = "jpeg"
    elif "png" in text:
        kind = "png"
    else:
        kind = None
    if kind is None:
        raise UnsupportedImage(f"compressed image format {fmt!r} is not supported; expected "
                               f"{' or '.join(COMPRESSED_FORMATS)} (image_transport 'compressed')")
    return kind


def compressed_to_bgr(msg) -> np.ndarray:
    """A sensor_msgs/CompressedImage (jpeg, png) as an HxWx3 uint8 BGR array."""
    import cv2

    compressed_kind(msg.format)
    data = np.frombuffer(msg.data, np.uint8)
    problem = damage(data.tobytes())
    if problem:
        raise ImageDecodeError(f"{_where(msg)}: {msg.format!r} data ({data.size} bytes) does not decode: "
                               f"{problem}")
    image = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    if image is None:
        raise ImageDecodeError(f"{_where(msg)}: {msg.format!r} data ({data.size} bytes) "
                               "does not decode")
    return image


def message_to_bgr(msg, msgtype: str) -> np.ndarray:
    """Either image message type as BGR; `msgtype` is the ROS 2 type name."""
    if msgtype == IMAGE:
        return image_to_bgr(msg)
    if msgtype == COMPRESSED:
        return compressed_to_bgr(msg)
    raise UnsupportedImage(f"message type {msgtype} is not an image; expected "
                           f"{' or '.join(IMAGE_TYPES)}")


def stamp_ns(stamp) -> int:
    """builtin_interfaces/Time as integer nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def time_msg(ns: int) -> dict:
    """Integer nanoseconds as builtin_interfaces/Time fields."""
    sec, nanosec = divmod(int(ns), 1_000_000_000)
    return {"sec": sec, "nanosec": nanosec}


def header(ns: int, frame_id: str) -> dict:
    return {"stamp": time_msg(ns), "frame_id": frame_id}


def bgr_to_image(image: np.ndarray, ns: int, frame_id: str, encoding: str = "rgb8") -> dict:
    """An HxWx3 BGR frame as sensor_msgs/Image fields (rgb8, bgr8 or mono8)."""
    import cv2

    if encoding == "rgb8":
        plane = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    elif encoding == "bgr8":
        plane = image
    elif encoding == "mono8":
        plane = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    else:
        raise EdgecapError(f"writing image encoding {encoding!r} is not supported; "
                           "expected rgb8, bgr8 or mono8")
    plane = np.ascontiguousarray(plane)
    height, width = plane.shape[:2]
    return {"header": header(ns, frame_id), "height": height, "width": width,
            "encoding": encoding, "is_bigendian": 0, "step": plane.strides[0],
            "data": plane.tobytes()}


def bgr_to_compressed(image: np.ndarray, ns: int, frame_id: str, kind: str = "jpeg") -> dict:
    """An HxWx3 BGR frame as sensor_msgs/CompressedImage fields (jpeg or png)."""
    import cv2

    ok, data = cv2.imencode(".jpg" if kind == "jpeg" else ".png", image)
    if not ok:
        raise EdgecapError(f"OpenCV cannot encode a {image.shape} frame as {kind}")
    return {"header": header(ns, frame_id), "format": kind, "data": data.tobytes()}
