"""The MCAP `ros2` profile's channel metadata on the logs edgecap writes (the caption log of
`edgecap run --out-mcap`, the camera log of `edgecap data synth --mcap`), checked with the
readers robot tooling uses: rosbags' rosbag2 MCAP storage reader (which parses
`offered_qos_profiles` into QoS objects), the mcap library, and rosbags' own rosbag2 MCAP
writer as the reference for the layout. Foxglove's view of the same metadata is in
test_ros_foxglove.py.
"""

import json
from pathlib import Path

import pytest

pytest.importorskip("rosbags")
pytest.importorskip("mcap_ros2")

from test_ros_logs import make_log, run_on  # noqa: E402

CAPTION_TOPICS = {"/edgecap/caption": "std_msgs/msg/String",
                  "/edgecap/record": "std_msgs/msg/String",
                  "/edgecap/annotations": "foxglove_msgs/msg/ImageAnnotations"}
CAMERA_TOPICS = {"/camera/image_raw": "sensor_msgs/msg/Image",
                 "/camera/camera_info": "sensor_msgs/msg/CameraInfo"}


def publisher_offer():
    """What `ros2 bag record` stores for a publisher with rclcpp / rclpy's default profile,
    read from the ROS graph: reliable, volatile, history and depth not reported, the unset
    durations as the middleware's infinity, automatic liveliness."""
    from rosbags import interfaces as ros

    infinite = ros.QosTime(9223372036, 854775807)
    return ros.Qos(ros.QosHistory.UNKNOWN, 0, ros.QosReliability.RELIABLE,
                   ros.QosDurability.VOLATILE, infinite, infinite, ros.QosLiveliness.AUTOMATIC,
                   infinite, False)


@pytest.fixture(scope="module")
def caption_log(tmp_path_factory):
    root = tmp_path_factory.mktemp("profile")
    log = make_log(root, "mcap", "image")
    detections = root / "det.jsonl"
    detections.write_text("".join(json.dumps(
        {"frame_id": i, "objects": [{"class": "cup", "box": [6, 4, 13, 9]}]}) + "\n"
        for i in range(5)))
    out = root / "captions.mcap"
    summary, error = run_on(log, replay="fast", pace="every", out_mcap=str(out),
                            detections=str(detections), coverage=False, quiet=True)
    assert error is None and summary.captioned == 5
    return out


@pytest.fixture(scope="module")
def camera_log(tmp_path_factory):
    from edgecap.cli import main

    out = tmp_path_factory.mktemp("synth") / "data"
    assert main(["data", "synth", "--out", str(out), "--images", "2", "--sequences", "0",
                 "--video-frames", "3", "--size", "32", "--mcap", "--quiet"]) == 0
    return out / "video" / "tabletop.mcap"


def channels(path):
    """{topic: (schema name, channel metadata)} as the mcap library reads the summary."""
    from mcap.reader import make_reader

    with Path(path).open("rb") as fh:
        summary = make_reader(fh).get_summary()
    return {c.topic: (summary.schemas[c.schema_id].name, dict(c.metadata))
            for c in summary.channels.values()}


def load_yaml(text):
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(text)


@pytest.fixture(params=["caption", "camera"])
def our_log(request):
    topics = CAPTION_TOPICS if request.param == "caption" else CAMERA_TOPICS
    return request.getfixturevalue(f"{request.param}_log"), topics


def test_rosbags_rosbag2_reader_gets_the_publishers_qos_on_every_channel(our_log):
    from rosbags.rosbag2 import Reader

    path, topics = our_log
    with Reader(path) as reader:
        seen = {c.topic: (c.msgtype, c.ext.offered_qos_profiles) for c in reader.connections}
    assert seen == {topic: (typename, [publisher_offer()]) for topic, typename in topics.items()}


def test_channel_metadata_is_the_ros2_profiles_and_parses_on_every_distro(our_log):
    """rosbag2 decodes channel QoS by the metadata version of the file's `rosbag2` record and
    assumes 8 (integer policies) without one: the policies must be integers then."""
    from mcap.reader import make_reader
    from rosbags.typesys import Stores, get_typestore

    from edgecap.ros.mcap_out import _typestore

    path, topics = our_log
    found = channels(path)
    assert {t: name for t, (name, _) in found.items()} == topics
    with Path(path).open("rb") as fh:
        reader = make_reader(fh)
        assert reader.get_header().profile == "ros2"
        assert "rosbag2" not in {m.name for m in reader.iter_metadata()}
    for topic, (typename, metadata) in found.items():
        assert set(metadata) == {"offered_qos_profiles", "topic_type_hash"}, topic
        (profile,) = load_yaml(metadata["offered_qos_profiles"])
        assert {k: profile[k] for k in ("history", "depth", "reliability", "durability",
                                        "liveliness")} == {
            "history": 3, "depth": 0, "reliability": 1, "durability": 2, "liveliness": 1}, topic
        assert profile["avoid_ros_namespace_conventions"] is False
        store = get_typestore(Stores.LATEST) if typename in get_typestore(
            Stores.LATEST).fielddefs else _typestore()
        assert metadata["topic_type_hash"] == store.hash_rihs01(typename), topic
        assert metadata["topic_type_hash"].startswith("RIHS01_")


def test_channel_qos_matches_what_rosbags_own_mcap_writer_records(caption_log, tmp_path):
    """rosbags' rosbag2 writer, version 8 (Humble's integer layout), MCAP storage, given the
    same publisher offer for the same topic: the QoS list parses to the same data."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.LATEST)
    bag = tmp_path / "reference"
    with Writer(bag, version=8, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("/edgecap/caption", "std_msgs/msg/String", typestore=store,
                                     offered_qos_profiles=[publisher_offer()])
        writer.write(conn, 1, store.serialize_cdr(
            store.types["std_msgs/msg/String"](data="x"), "std_msgs/msg/String"))
    (reference_file,) = bag.glob("*.mcap")
    reference = channels(reference_file)["/edgecap/caption"][1]["offered_qos_profiles"]
    ours = channels(caption_log)["/edgecap/caption"][1]["offered_qos_profiles"]
    assert load_yaml(ours) == load_yaml(reference)
