"""sensor_msgs Image / CompressedImage -> BGR (edgecap.ros.images), on messages as rosbags
deserialises them: the conversion the log source and the ROS 2 node share."""

import cv2
import numpy as np
import pytest

from edgecap.ros.images import (
    ImageDecodeError,
    UnsupportedImage,
    bgr_to_compressed,
    compressed_to_bgr,
    image_to_bgr,
)

rosbags_typesys = pytest.importorskip("rosbags.typesys")


@pytest.fixture(scope="module")
def store():
    return rosbags_typesys.get_typestore(rosbags_typesys.Stores.LATEST)


def _image(store, plane: np.ndarray, encoding: str, pad: int = 0, bigendian: int = 0,
           rows: int | None = None):
    """A sensor_msgs/Image through rosbags' CDR serialiser and back, as a log holds it;
    `rows` is the image height when the plane stores more rows (planar YUV)."""
    T = store.types
    height, width = plane.shape[:2]
    row = plane.reshape(height, -1).view(np.uint8)
    data = np.zeros((height, row.shape[1] + pad), np.uint8)
    data[:, : row.shape[1]] = row
    msg = T["sensor_msgs/msg/Image"](
        header=T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=5, nanosec=7),
                                        frame_id="cam"),
        height=rows or height, width=width, encoding=encoding, is_bigendian=bigendian,
        step=data.shape[1], data=data.reshape(-1))
    raw = store.serialize_cdr(msg, "sensor_msgs/msg/Image")
    return store.deserialize_cdr(raw, "sensor_msgs/msg/Image")


RNG = np.random.default_rng(0)
BGR = RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8)


def test_colour_encodings_become_the_same_bgr_frame(store):
    assert np.array_equal(image_to_bgr(_image(store, BGR, "bgr8", pad=3)), BGR)
    assert np.array_equal(image_to_bgr(_image(store, BGR[:, :, ::-1].copy(), "rgb8")), BGR)
    rgba = np.dstack([BGR[:, :, ::-1], np.full(BGR.shape[:2], 9, np.uint8)])
    assert np.array_equal(image_to_bgr(_image(store, rgba, "rgba8", pad=1)), BGR)
    mono = BGR[:, :, 1].copy()
    assert np.array_equal(image_to_bgr(_image(store, mono, "mono8")), np.dstack([mono] * 3))


@pytest.mark.parametrize("bigendian", [0, 1])
def test_16_bit_mono_maps_its_full_range_onto_8_bits(store, bigendian):
    values = np.array([[0, 257, 32896, 65535]], np.uint16)
    wire = values.astype(">u2" if bigendian else "<u2")
    out = image_to_bgr(_image(store, wire, "mono16", bigendian=bigendian))
    assert out.shape == (1, 4, 3)
    assert out[0, :, 0].tolist() == [0, 1, 128, 255]


@pytest.mark.parametrize("encoding, pattern", [
    ("bayer_rggb8", ["R", "G", "G", "B"]), ("bayer_bggr8", ["B", "G", "G", "R"]),
    ("bayer_gbrg8", ["G", "B", "R", "G"]), ("bayer_grbg8", ["G", "R", "B", "G"]),
])
def test_bayer_mosaics_demosaic_to_the_scene_colour(store, encoding, pattern):
    # A flat orange scene seen through the named 2x2 colour filter: (0,0), (0,1), (1,0), (1,1).
    colour = {"B": 40, "G": 120, "R": 220}
    mosaic = np.zeros((8, 8), np.uint8)
    for (dy, dx), channel in zip([(0, 0), (0, 1), (1, 0), (1, 1)], pattern, strict=True):
        mosaic[dy::2, dx::2] = colour[channel]
    out = image_to_bgr(_image(store, mosaic, encoding))
    centre = out[2:6, 2:6].reshape(-1, 3).mean(axis=0)
    assert np.allclose(centre, [40, 120, 220], atol=2)


def test_unknown_encoding_names_itself_and_the_supported_ones(store):
    with pytest.raises(UnsupportedImage, match=r"'32FC1' is not supported; expected one of .*rgb8"):
        image_to_bgr(_image(store, np.zeros((2, 2), np.float32), "32FC1"))


def test_data_shorter_than_the_header_says_is_a_bad_frame(store):
    msg = _image(store, BGR, "bgr8")
    msg.height = 50
    with pytest.raises(ImageDecodeError, match="cannot hold 7x50 bgr8"):
        image_to_bgr(msg)


def _compressed(store, fields):
    T = store.types
    msg = T["sensor_msgs/msg/CompressedImage"](
        header=T["std_msgs/msg/Header"](
            stamp=T["builtin_interfaces/msg/Time"](**fields["header"]["stamp"]),
            frame_id=fields["header"]["frame_id"]),
        format=fields["format"], data=np.frombuffer(fields["data"], np.uint8))
    raw = store.serialize_cdr(msg, "sensor_msgs/msg/CompressedImage")
    return store.deserialize_cdr(raw, "sensor_msgs/msg/CompressedImage")


def test_compressed_png_and_jpeg_decode(store):
    png = _compressed(store, bgr_to_compressed(BGR, 1, "cam", "png"))
    assert np.array_equal(compressed_to_bgr(png), BGR)
    smooth = cv2.resize(BGR, (64, 48), interpolation=cv2.INTER_CUBIC)
    jpeg = _compressed(store, bgr_to_compressed(smooth, 1, "cam", "jpeg"))
    jpeg.format = "bgr8; jpeg compressed bgr8"  # image_transport's long form
    assert np.abs(compressed_to_bgr(jpeg).astype(int) - smooth).mean() < 8


def test_compressed_garbage_is_a_bad_frame_and_depth_is_unsupported(store):
    fields = bgr_to_compressed(BGR, 1, "cam", "jpeg")
    fields["data"] = fields["data"][:20]
    with pytest.raises(ImageDecodeError, match="does not decode"):
        compressed_to_bgr(_compressed(store, fields))
    fields["format"] = "16UC1; compressedDepth"
    with pytest.raises(UnsupportedImage, match="compressedDepth"):
        compressed_to_bgr(_compressed(store, fields))


def _bt601(bgr):
    """(Y, U, V) of a colour, BT.601 video range: what a YUV camera sends for it."""
    b, g, r = (c / 255 for c in bgr)
    return (round(16 + 65.481 * r + 128.553 * g + 24.966 * b),
            round(128 - 37.797 * r - 74.203 * g + 112.0 * b),
            round(128 + 112.0 * r - 93.786 * g - 18.214 * b))


@pytest.mark.parametrize("encoding", ["uyvy", "yuv422", "yuyv", "yuv422_yuy2"])
def test_packed_yuv_422_cameras_become_their_colour(store, encoding):
    # Byte order per pixel pair: UYVY = U Y0 V Y1, YUYV = Y0 U Y1 V.
    colour = (40, 120, 220)
    y, u, v = _bt601(colour)
    pair = [u, y, v, y] if encoding in ("uyvy", "yuv422") else [y, u, y, v]
    plane = np.tile(np.array(pair, np.uint8), (4, 3)).reshape(4, 6, 2)
    out = image_to_bgr(_image(store, plane, encoding, pad=2))
    assert out.shape == (4, 6, 3)
    assert np.allclose(out.reshape(-1, 3), colour, atol=2)


def test_packed_yuv_with_an_odd_width_is_a_bad_frame(store):
    with pytest.raises(ImageDecodeError, match="uyvy needs an even width, not 5"):
        image_to_bgr(_image(store, np.zeros((2, 5, 2), np.uint8), "uyvy"))


@pytest.mark.parametrize("encoding", ["nv12", "nv21"])
def test_planar_yuv_420_becomes_its_colour(store, encoding):
    # Y rows, then half as many rows of chroma pairs: U V (nv12) or V U (nv21).
    colour = (40, 120, 220)
    y, u, v = _bt601(colour)
    height, width = 4, 6
    luma = np.full((height, width), y, np.uint8)
    pair = [u, v] if encoding == "nv12" else [v, u]
    chroma = np.tile(np.array(pair, np.uint8), (height // 2, width // 2))
    out = image_to_bgr(_image(store, np.vstack([luma, chroma]), encoding, pad=2, rows=height))
    assert out.shape == (height, width, 3)
    assert np.allclose(out.reshape(-1, 3), colour, atol=2)
    swapped = "nv21" if encoding == "nv12" else "nv12"
    wrong = image_to_bgr(_image(store, np.vstack([luma, chroma]), swapped, rows=height))
    assert not np.allclose(wrong.reshape(-1, 3), colour, atol=10)
