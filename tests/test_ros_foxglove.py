"""Our logs as Foxglove reads them: tests/js/read_mcap.mjs opens them with the JavaScript
libraries the Foxglove app is built on (@mcap/core's indexed reader, @foxglove/rosmsg for the
`ros2msg` schemas, @foxglove/rosmsg2-serialization for CDR), and the ImageAnnotations field
lists are checked against @foxglove/schemas' own ROS 2 definitions. What is left to a person
with Foxglove open is the drawing itself (docs/runtime.md, "What Foxglove shows").

The caption logs are written by `edgecap run`'s loop over camera logs made by rosbags' and
mcap-ros2-support's own writers. Skipped when node or npm is missing; tests/js/node_modules is
installed by `make test` (npm ci), or here when it is missing or stale.
"""

import base64
import fcntl
import io
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rosbags")
pytest.importorskip("mcap_ros2")

if shutil.which("node") is None or shutil.which("npm") is None:
    pytest.skip("node and npm are not installed: Foxglove's JavaScript MCAP readers (tests/js) "
                "cannot run", allow_module_level=True)

from runtime_helpers import FakeBundle  # noqa: E402
from test_ros_logs import frames, make_log  # noqa: E402

from edgecap.runtime.captioner import Captioner  # noqa: E402
from edgecap.runtime.command import RunSettings, execute  # noqa: E402
from edgecap.runtime.overlay import GREEN, GREY  # noqa: E402

JS = Path(__file__).resolve().parent / "js"
ANNOTATION_TYPES = ["ImageAnnotations", "PointsAnnotation", "TextAnnotation", "CircleAnnotation",
                    "Point2", "Color", "KeyValuePair"]


def _installed_matches_lock() -> bool:
    """npm's record of what is in node_modules agrees with package-lock.json."""
    try:
        installed = json.loads((JS / "node_modules" / ".package-lock.json").read_text())["packages"]
    except (OSError, ValueError, KeyError):
        return False
    wanted = json.loads((JS / "package-lock.json").read_text())["packages"]
    return all(installed.get(path, {}).get("version") == entry.get("version")
               for path, entry in wanted.items() if path)


@pytest.fixture(scope="session")
def foxglove_js():
    """tests/js with its node_modules as package-lock.json pins them (npm ci when they are not:
    a plain `pytest` run on a fresh clone, without `make test`)."""
    with open(JS / ".npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed_matches_lock():
            res = subprocess.run(["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund",
                                  "--loglevel=error"], cwd=JS, capture_output=True, text=True,
                                 timeout=600)
            assert res.returncode == 0, f"npm ci in {JS} failed:\n{res.stderr}"
    return JS


def node(js, *args):
    res = subprocess.run(["node", str(js / "read_mcap.mjs"), *map(str, args)], cwd=js,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


class FoxgloveView:
    """A log as read by tests/js/read_mcap.mjs: the file line, channels by topic, messages by
    topic (log-time order)."""

    def __init__(self, lines):
        self.file = next(x for x in lines if x["kind"] == "file")
        self.channels = {x["topic"]: x for x in lines if x["kind"] == "channel"}
        self.messages = {}
        for x in lines:
            if x["kind"] == "message":
                self.messages.setdefault(x["topic"], []).append(x)


def read_in_foxglove(js, path) -> FoxgloveView:
    return FoxgloveView(node(js, path))


def official_definitions(js, names):
    """{type name: definition} of @foxglove/schemas' ROS 2 messages `names` and every type they
    use, parsed by @foxglove/rosmsg (each top-level type under its full name)."""
    out = {}
    for line in node(js, "--foxglove-ros2", *names):
        out.update(_by_type(line["definitions"], line["name"]))
    return out


def _by_type(definitions, top):
    """{type: (fields in wire order, constants by name)}: constants have no place in the CDR
    layout (rosbags writes them first in a schema, Foxglove's generator where the .msg has them)."""
    return {d["name"] or top: ([f for f in d["fields"] if not f.get("isConstant")],
                               {f["name"]: f for f in d["fields"] if f.get("isConstant")})
            for d in definitions}


def assert_ros2_profile_metadata(channel):
    """The channel metadata the MCAP `ros2` profile asks for, as Foxglove's reader hands it
    over (its topic list and Problems panel see these): one reliable, volatile offer."""
    from ruamel.yaml import YAML

    metadata = channel["metadata"]
    assert set(metadata) == {"offered_qos_profiles", "topic_type_hash"}, channel["topic"]
    (offer,) = YAML(typ="safe").load(metadata["offered_qos_profiles"])
    assert (offer["reliability"], offer["durability"]) == (1, 2), channel["topic"]
    assert metadata["topic_type_hash"].startswith("RIHS01_"), channel["topic"]


def _ns(time):
    return time["sec"] * 1_000_000_000 + time["nanosec"]


def _rgb(bgr):
    b, g, r = bgr
    return [r / 255.0, g / 255.0, b / 255.0, 1.0]


@pytest.fixture(scope="module")
def caption_log(tmp_path_factory):
    """`edgecap run --out-mcap` over a 5-image rosbag2 MCAP log written by rosbags, with a
    cup and a bottle known in every frame; (caption log, records)."""
    root = tmp_path_factory.mktemp("foxglove")
    log = make_log(root, "mcap", "image")
    detections = root / "det.jsonl"
    detections.write_text("".join(json.dumps(
        {"frame_id": i, "objects": [{"class": "cup", "box": [6, 4, 13, 9]},
                                    {"class": "bottle", "box": [20, 10, 30, 20]}]}) + "\n"
        for i in range(5)))
    out, jsonl = root / "captions.mcap", root / "captions.jsonl"
    summary, error = execute(
        Captioner(FakeBundle(batch_size=1, beam_size=1)),
        RunSettings(source=str(log), replay="fast", pace="every", out_mcap=str(out),
                    jsonl=str(jsonl), detections=str(detections), coverage=True, quiet=True),
        out=io.StringIO())
    assert error is None and summary.captioned == 5
    return out, [json.loads(line) for line in jsonl.read_text().splitlines()]


@pytest.fixture(scope="module")
def caption_view(foxglove_js, caption_log) -> FoxgloveView:
    return read_in_foxglove(foxglove_js, caption_log[0])


def test_captions_decode_in_foxglove_at_the_image_times(caption_log, caption_view):
    records, view = caption_log[1], caption_view
    assert view.file["reader"] == "indexed" and view.file["profile"] == "ros2"
    assert {t: c["schemaName"] for t, c in view.channels.items()} == {
        "/edgecap/caption": "std_msgs/msg/String", "/edgecap/record": "std_msgs/msg/String",
        "/edgecap/annotations": "foxglove_msgs/msg/ImageAnnotations"}
    stamps, log_times = [f[0] for f in frames()], [f[1] for f in frames()]
    captions = view.messages["/edgecap/caption"]
    assert [m["message"]["data"] for m in captions] == [r["caption"] for r in records]
    assert all(m["message"]["data"].endswith(" cup") for m in captions)
    for topic, channel in view.channels.items():
        assert [int(m["logTime"]) for m in view.messages[topic]] == log_times, topic
        assert int(channel["messageCount"]) == 5, topic
        assert not any(m["trailingBytes"] for m in view.messages[topic]), topic
        assert_ros2_profile_metadata(channel)
    assert [json.loads(m["message"]["data"]) for m in view.messages["/edgecap/record"]] == records
    assert [r["header_stamp_ns"] for r in records] == stamps


def test_annotations_decode_in_foxglove_on_the_image_they_belong_to(caption_log, caption_view):
    records, annotations = caption_log[1], caption_view.messages["/edgecap/annotations"]
    for stamp, record, logged in zip([f[0] for f in frames()], records, annotations, strict=True):
        msg = logged["message"]
        assert _ns(msg["timestamp"]) == stamp
        assert {_ns(a["timestamp"]) for a in msg["points"] + msg["texts"]} == {stamp}
        cup, bottle = msg["points"]
        assert cup["type"] == bottle["type"] == 2            # LINE_LOOP: a closed outline
        # inclusive pixel box [6, 13] x [4, 9] -> pixel-corner coordinates
        assert [(p["x"], p["y"]) for p in cup["points"]] == [(6, 4), (14, 4), (14, 10), (6, 10)]
        assert list(cup["outline_color"].values()) == pytest.approx(_rgb(GREEN))   # named
        assert list(bottle["outline_color"].values()) == pytest.approx(_rgb(GREY))  # not named
        assert cup["fill_color"]["a"] == 0 and cup["thickness"] > bottle["thickness"] > 0
        texts = msg["texts"]
        assert [t["text"] for t in texts] == ["cup", "bottle", record["caption"]]
        assert all(t["font_size"] > 0 and t["text_color"]["a"] == 1 for t in texts)
        assert msg["circles"] == [] and msg["metadata"] == []
        # each box's class and whether the caption names it, on its outline and its label
        for outline, label, mention in ((cup, texts[0], "named"), (bottle, texts[1], "not named")):
            pairs = {p["key"]: p["value"] for p in outline["metadata"]}
            assert pairs == {"class": label["text"], "mention": mention}
            assert label["metadata"] == outline["metadata"]
        assert texts[2]["metadata"] == []


def test_annotation_schema_is_foxgloves_own(foxglove_js, caption_view):
    """Every type of the annotations channel has exactly the fields (names, types, order) and
    constants of the ROS 2 definition @foxglove/schemas generates, so ros2 bag play into a
    node built against foxglove_msgs decodes the same bytes."""
    channel = caption_view.channels["/edgecap/annotations"]
    ours = _by_type(channel["definitions"], "foxglove_msgs/msg/ImageAnnotations")
    official = official_definitions(foxglove_js, ANNOTATION_TYPES)
    for name, fields in ours.items():
        if name.startswith("foxglove_msgs/"):
            assert fields == official[name], name
    assert set(ours) >= {"foxglove_msgs/msg/ImageAnnotations", "foxglove_msgs/PointsAnnotation",
                         "foxglove_msgs/TextAnnotation", "foxglove_msgs/Color",
                         "foxglove_msgs/Point2"}


def test_synth_camera_log_decodes_in_foxglove_as_image_and_camera_info(foxglove_js, tmp_path,
                                                                       run_cli):
    from edgecap.data.synth import TabletopWorld
    from edgecap.data.synth.rosbag import START_NS, TRANSPORT_NS

    code, _, stderr = run_cli("data", "synth", "--out", tmp_path / "data", "--images", 2,
                              "--sequences", 0, "--video-frames", 6, "--size", 32, "--mcap",
                              "--quiet")
    assert code == 0, stderr
    view = read_in_foxglove(foxglove_js, tmp_path / "data" / "video" / "tabletop.mcap")
    assert view.file["reader"] == "indexed"
    assert {t: c["schemaName"] for t, c in view.channels.items()} == {
        "/camera/image_raw": "sensor_msgs/msg/Image",
        "/camera/camera_info": "sensor_msgs/msg/CameraInfo"}
    for channel in view.channels.values():
        assert_ros2_profile_metadata(channel)
    images, infos = view.messages["/camera/image_raw"], view.messages["/camera/camera_info"]
    assert len(images) == len(infos) == 6
    world = TabletopWorld(0, 32, 15.0)
    for t, (image, info) in enumerate(zip(images, infos, strict=True)):
        msg, cal = image["message"], info["message"]
        stamp = START_NS + round(t * 1e9 / 15)
        assert _ns(msg["header"]["stamp"]) == _ns(cal["header"]["stamp"]) == stamp
        assert int(image["logTime"]) == int(info["logTime"]) == stamp + TRANSPORT_NS
        assert msg["header"]["frame_id"] == cal["header"]["frame_id"] == "camera_optical"
        assert (msg["encoding"], msg["width"], msg["height"], msg["step"]) == ("rgb8", 32, 32, 96)
        rgb = np.frombuffer(base64.b64decode(msg["data"]["base64"]), np.uint8).reshape(32, 32, 3)
        assert (rgb[:, :, ::-1] == world.render(t).image).all()
        focal = world.camera(t).focal * 32
        assert cal["k"] == pytest.approx([focal, 0, 16, 0, focal, world.camera(t).horizon * 32,
                                          0, 0, 1])
        assert (cal["width"], cal["height"], cal["distortion_model"]) == (32, 32, "plumb_bob")
