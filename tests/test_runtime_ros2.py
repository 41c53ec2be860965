"""The ROS 2 node's frame handling (edgecap.ros2.relay) on messages deserialised from a real log,
and its field dicts built into message objects, here rosbags' classes standing in for rclpy's
generated ones; robot/ros2_caption_node.py is an alias of `edgecap ros2`. The node on a live
graph: tests/test_ros2_live.py."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import FakeBundle

SCRIPT = Path(__file__).resolve().parents[1] / "robot" / "ros2_caption_node.py"


def test_the_robot_launcher_runs_the_packaged_node():
    """`python3 robot/ros2_caption_node.py BUNDLE --ros-args ...` from a checkout: `edgecap ros2`,
    here stopped at its first check (rclpy missing, or the bundle)."""
    done = subprocess.run([sys.executable, str(SCRIPT), "/nonexistent/bundle", "--ros-args"],
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    if importlib.util.find_spec("rclpy") is None:
        assert line == ('edgecap ros2: error: rclpy is not installed (or source a ROS 2 install: source '
                        '/opt/ros/$ROS_DISTRO/setup.bash): pip install "edgecap[ros2]"')
    else:
        assert line.startswith("edgecap ros2: error: ") and "/nonexistent/bundle" in line


@pytest.fixture
def logged(tmp_path):
    """Messages as the node receives them: written to a log by rosbags, read back."""
    pytest.importorskip("rosbags")
    from test_ros_logs import COMPRESSED, IMAGE, compressed_msg, frames, image_msg, write_rosbag2

    from edgecap.ros.logs import open_log

    shots = frames(3)
    bag = write_rosbag2(tmp_path / "bag", "sqlite3", {
        "/raw": (IMAGE, [(log, image_msg(stamp, img)) for stamp, log, img in shots]),
        "/jpeg": (COMPRESSED, [(log, compressed_msg(stamp, img)) for stamp, log, img in shots])})
    with open_log(bag) as log:
        return {topic: [msg for _, msg in log.messages(topic)] for topic in ("/raw", "/jpeg")}, shots


def test_relay_turns_an_image_message_into_the_caption_log_messages(logged):
    from edgecap.ros2.messages import caption_marker
    from edgecap.ros2.relay import CaptionRelay
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.mcap_sink import record_messages
    from edgecap.runtime.records import Record

    messages, shots = logged
    captioner = Captioner(FakeBundle(batch_size=1, beam_size=1))
    for topic, msgtype in (("/raw", "sensor_msgs/msg/Image"),
                           ("/jpeg", "sensor_msgs/msg/CompressedImage")):
        frame = CaptionRelay(msgtype).frame(messages[topic][1], received=1.0, received_ns=shots[1][1] + 10)
        [caption] = captioner.caption([frame.image])
        record = Record(frame, caption, f"ros2:{topic}", 2.0)
        out = record_messages(record)[1]
        assert [(t, m) for t, m, _ in out] == [("/edgecap/caption", "std_msgs/msg/String"),
                                               ("/edgecap/record", "std_msgs/msg/String")]
        fields = json.loads(out[1][2]["data"])
        assert fields["header_stamp_ns"] == shots[1][0]   # the camera's stamp, not arrival
        assert fields["caption"] == out[0][2]["data"] == "a green cup"
        marker = caption_marker(record, 0)                # the stamped caption: the image's header
        assert marker["header"] == {"stamp": {"sec": shots[1][0] // 10**9, "nanosec": shots[1][0] % 10**9},
                                    "frame_id": "camera_optical"}
        assert marker["text"] == "a green cup" and marker["type"] == 9   # TEXT_VIEW_FACING


def test_relay_skips_an_undecodable_message_and_refuses_depth(logged):
    from edgecap.ros2.relay import CaptionRelay, ImageDecodeError, Refused

    messages, _ = logged
    broken = messages["/jpeg"][0]
    broken.data = np.frombuffer(b"\xff\xd8 not a jpeg", np.uint8)
    relay = CaptionRelay("sensor_msgs/msg/CompressedImage")
    with pytest.raises(ImageDecodeError, match="does not decode"):
        relay.frame(broken, 0.0, 0)
    depth = messages["/raw"][0]
    depth.encoding, depth.step = "16UC1", depth.width * 2
    depth.data = np.zeros(depth.height * depth.width * 2, np.uint8)
    with pytest.raises(Refused, match="'16UC1' is not a colour image.*allow_non_colour:=true"):
        CaptionRelay("sensor_msgs/msg/Image").frame(depth, 0.0, 0)
    allowed = CaptionRelay("sensor_msgs/msg/Image", allow_non_colour=True)
    assert allowed.frame(depth, 0.0, 0).image.shape == (depth.height, depth.width, 3)


def test_annotation_fields_build_into_message_objects_that_serialise():
    pytest.importorskip("rosbags")
    from edgecap.ros.captions import ANNOTATIONS, Box, image_annotations, to_ros
    from edgecap.ros.mcap_out import _typestore

    store = _typestore()
    fields = image_annotations(1_000_000_123, 64, [Box(1, 2, 10, 12, "cup", (0, 1, 0, 1))],
                               "a cup on a table")
    msg = to_ros(fields, ANNOTATIONS, lambda name: store.types[name])
    assert msg.points[0].points[2].x == 11 and msg.points[0].timestamp.nanosec == 123
    assert msg.texts[-1].text == "a cup on a table"
    raw = store.serialize_cdr(msg, ANNOTATIONS)
    assert store.deserialize_cdr(raw, ANNOTATIONS).points[0].outline_color.g == 1.0


def test_annotations_build_for_a_foxglove_msgs_older_than_3_2_5():
    """A robot with foxglove_msgs before 3.2.5 installed has no ImageAnnotations.timestamp and no
    metadata lists: the node still publishes the boxes and texts (its classes stand in here as
    rosbags classes made from the package's older field lists)."""
    pytest.importorskip("rosbags")
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    from edgecap.ros.captions import (
        ADDED_IN_3_2_5,
        ANNOTATIONS,
        FOXGLOVE_MSGS,
        Box,
        image_annotations,
        to_ros,
    )

    store = get_typestore(Stores.LATEST)
    for name, text in FOXGLOVE_MSGS.items():
        if name != "foxglove_msgs/msg/KeyValuePair":
            added = ADDED_IN_3_2_5.get(name, frozenset())
            older = "".join(line + "\n" for line in text.splitlines()
                            if line.rpartition(" ")[2] not in added)
            store.register(get_types_from_msg(older, name))
    assert "timestamp" not in store.types[ANNOTATIONS].__dataclass_fields__
    fields = image_annotations(1_000_000_123, 64, [Box(1, 2, 10, 12, "cup", (0, 1, 0, 1))],
                               "a cup on a table")
    msg = to_ros(fields, ANNOTATIONS, lambda name: store.types[name])
    back = store.deserialize_cdr(store.serialize_cdr(msg, ANNOTATIONS), ANNOTATIONS)
    assert back.points[0].timestamp.nanosec == 123 and back.texts[-1].text == "a cup on a table"
    assert not hasattr(back, "metadata") and not hasattr(back.texts[0], "metadata")
