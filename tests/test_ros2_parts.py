"""The ROS 2 node without a ROS graph (the node on a live graph: tests/test_ros2_live.py).

- Its parts: the parameter table, detections matched by stamp (JSON and vision_msgs' layout)
  and never blocking, the newest-frame slot, diagnostics levels and rate-limited warnings.
- Its frame handling (edgecap.ros2.relay) on messages deserialised from a real log, and its
  field dicts built into message objects, here rosbags' classes standing in for rclpy's
  generated ones; robot/ros2_caption_node.py is an alias of `edgecap ros2`."""

import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pytest
from runtime_helpers import FakeBundle

from edgecap.errors import EdgecapError
from edgecap.ros2.detections import StampedObjects, json_objects, vision_objects
from edgecap.ros2.frames import ImageSlot
from edgecap.ros2.params import BY_NAME, PARAMS, ParameterError, check_all
from edgecap.ros2.stats import CountedWarning, SequenceGaps


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("max_rate", 5, 5.0), ("max_rate", 2.5, 2.5), ("beam", 3.0, 3), ("beam", 0, 0),
    ("qos", "reliable", "reliable"), ("compressed", True, True), ("stamp_tolerance", 0, 0.0),
])
def test_parameters_take_ints_and_floats_alike(name, value, expected):
    got = BY_NAME[name].check(value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("max_rate", 0, "parameter max_rate: 0 is not a finite number > 0"),
    ("max_rate", "fast", "parameter max_rate: 'fast' is not a finite number > 0"),
    ("max_rate", float("nan"), "parameter max_rate: nan is not a finite number > 0"),
    ("beam", 2.5, "parameter beam: 2.5 is not an integer in 0..100"),
    ("beam", True, "parameter beam: True is not an integer in 0..100"),
    ("qos", "fast", "parameter qos: 'fast' is not one of sensor_data, reliable"),
    ("compressed", 1, "parameter compressed: 1 is not true or false"),
    ("qos_depth", 0, "parameter qos_depth: 0 is not an integer in 1..1000"),
    # issue 41: values that used to end in a pybind11 / rclpy TypeError deep in the start-up
    ("threads", 99999999999, "parameter threads: 99999999999 is not an integer in 0..1024"),
    ("qos_depth", 100000000000, "parameter qos_depth: 100000000000 is not an integer in 1..1000"),
    ("output_durability", "forever", "parameter output_durability: 'forever' is not one of volatile, transient_local"),
])
def test_bad_parameter_values_are_refused_in_one_line(name, value, message):
    with pytest.raises(ParameterError) as info:
        BY_NAME[name].check(value)
    assert str(info.value) == message


def test_the_shipped_parameters_file_holds_every_parameter_with_a_valid_value():
    yaml = pytest.importorskip("yaml")
    from edgecap.ros2.command import SHARE

    params = yaml.safe_load((SHARE / "edgecap-ros2.yaml").read_text())["/**"]["ros__parameters"]
    assert set(params) == {p.name for p in PARAMS}
    checked = check_all(params)
    assert {p.name: getattr(checked, p.name) for p in PARAMS if p.name != "bundle"} == {
        p.name: p.default for p in PARAMS if p.name != "bundle"}


def test_parameters_mirroring_a_cli_option_admit_what_the_option_admits():
    """One table of bounds: the node's threads and max_rate are `edgecap run --threads` and
    `--max-fps`; every bounded parameter's ROS descriptor carries its range (rqt_reconfigure)."""
    from edgecap.argtypes import POSITIVE, THREADS

    assert BY_NAME["threads"].bounds is THREADS and BY_NAME["max_rate"].bounds is POSITIVE
    assert BY_NAME["threads"].descriptor_range() == ("integer_range", 0, 1024)
    assert BY_NAME["qos_depth"].descriptor_range() == ("integer_range", 1, 1000)
    assert BY_NAME["max_loss"].descriptor_range() == ("floating_point_range", 0.0, 1.0)
    for p in PARAMS:
        assert (p.descriptor_range() is None) == (p.bounds is None), p.name
        if p.bounds is not None:
            _, low, high = p.descriptor_range()
            assert p.check(high) == high and low <= p.default <= high


def test_a_parameter_change_replaces_the_settings_whole_or_not_at_all():
    from dataclasses import FrozenInstanceError

    from edgecap.ros2.params import changed

    params = check_all({"bundle": "b"})
    with pytest.raises(FrozenInstanceError):
        params.max_rate = 1.0
    new = changed(params, {"max_rate": 2, "beam": 3})
    assert (new.max_rate, new.beam, params.max_rate, params.beam) == (2.0, 3, 5.0, 0)
    with pytest.raises(ParameterError, match="parameter beam"):
        changed(params, {"max_rate": 2, "beam": -1})


def test_json_detections_read_like_a_detections_file_line():
    stamp, objects = json_objects(json.dumps({"stamp": {"sec": 12, "nanosec": 5},
                                              "objects": [{"class": "TVMonitor", "box": [1, 2, 30, 40]}]}))
    assert stamp == 12_000_000_005 and objects == [("television", (1.0, 2.0, 30.0, 40.0), None)]
    assert json_objects('{"stamp_ns": 7, "objects": []}') == (7, [])
    for text, message in (("{", "not JSON"), ('{"objects": []}', "missing 'stamp'"),
                          ('{"stamp_ns": 1, "objects": [{"class": "cup", "box": [3, 0, 1, 1]}]}',
                           "right < left")):
        with pytest.raises(EdgecapError, match=message):
            json_objects(text)


def _detection(cx, cy, w, h, *hypotheses, nested=True):
    results = [NS(hypothesis=NS(class_id=c, score=s), pose=None) if nested else NS(id=c, score=s)
               for c, s in hypotheses]
    center = NS(position=NS(x=cx, y=cy), theta=0.0) if nested else NS(x=cx, y=cy, theta=0.0)
    return NS(results=results, bbox=NS(center=center, size_x=w, size_y=h))


def test_vision_msgs_detections_take_the_best_hypothesis_and_the_centred_box():
    msg = NS(header=NS(stamp=NS(sec=3, nanosec=9)), detections=[
        _detection(50, 40, 20, 10, ("cup", 0.3), ("bowl", 0.8)),
        _detection(10, 10, 4, 4, ("dining_table", 0.9), nested=False),   # vision_msgs 3.x fields
        NS(results=[], bbox=None)])
    stamp, objects = vision_objects(msg)
    assert stamp == 3_000_000_009
    assert objects == [("bowl", (40.0, 35.0, 60.0, 45.0), None), ("dining table", (8.0, 8.0, 12.0, 12.0), None)]


def test_detections_match_the_nearest_stamp_within_the_tolerance_and_wait_for_late_ones():
    sets = StampedObjects(keep=3)
    sets.add(1_000_000_000, ["a"])
    sets.add(1_200_000_000, ["b"])
    assert sets.match(1_030_000_000, 0.05) == ["a"]
    assert sets.match(1_100_000_000, 0.05) is None              # 100 ms from both
    threading.Timer(0.05, sets.add, (1_400_000_000, ["late"])).start()
    assert sets.match(1_400_000_000, 0.0, wait_s=5.0) == ["late"]
    for stamp in (2, 3, 4):
        sets.add(stamp * 1_000_000_000, [stamp])
    assert sets.match(1_000_000_000, 0.05) is None              # only the newest 3 are kept
    assert sets.report() == {"received": 6, "matched_frames": 2, "unmatched_frames": 2, "boxes_outside_frame": 0}


class _Relay:
    """Messages that are their own frames ("bad": undecodable, "depth": refused)."""

    def frame(self, msg, received, received_ns):
        from edgecap.ros2.relay import ImageDecodeError, Refused

        if msg == "bad":
            raise ImageDecodeError("does not decode")
        if msg == "depth":
            raise Refused("image encoding '16UC1' is not a colour image")
        return NS(image=msg, t_taken=None)


def test_the_image_slot_keeps_the_newest_frame_and_counts_drops_skips_and_refusals():
    logged = []
    slot = ImageSlot(_Relay(), depth=1, log=logged.append)
    for i in range(5):
        slot.put(f"f{i}", float(i), i)
    assert slot.get(0.1).image == "f4" and slot.get(0.01) is None
    assert (slot.stats.captured, slot.stats.dropped, slot.stats.taken) == (5, 4, 1)
    slot.put("bad", 5.0, 5)
    slot.put("x", 5.1, 6)        # the undecodable one was overwritten, never decoded
    assert slot.get(0.1).image == "x" and slot.stats.skipped == 0
    for msg in ("bad", "depth"):
        slot.put(msg, 6.0, 7)
        assert slot.get(0.1) is None
    assert (slot.stats.skipped, slot.refused) == (1, 1) and len(logged) == 2
    assert slot.last_publish == 6.0 and not slot.finished
    slot.close()
    assert slot.finished and slot.get(1.0) is None


def test_a_deeper_slot_hands_a_burst_over_oldest_first():
    slot = ImageSlot(_Relay(), depth=3)
    for i in range(5):
        slot.put(i, float(i), i)
    assert [slot.get(0.1).image for _ in range(3)] == [2, 3, 4] and slot.stats.dropped == 2
    threading.Timer(0.05, slot.put, ("late", 9.0, 9)).start()
    assert slot.get(5.0).image == "late"     # waits for the next one


def test_repeated_warnings_give_one_line_per_period_with_counts():
    now = [0.0]
    warning = CountedWarning("refused", period=10.0, clock=lambda: now[0])
    assert warning.note("16UC1") == "refused 1 frame (1 in all): 16UC1"
    for t in (1.0, 2.0, 9.0):
        now[0] = t
        assert warning.note("16UC1") is None
    now[0] = 10.5
    assert warning.note("16UC1") == "refused 4 frames (5 in all): 16UC1"


def test_frames_lost_on_the_way_are_counted_from_sequence_gaps_per_publisher():
    gaps = SequenceGaps()
    for publisher, sequence in (("a", 1), ("a", 2), ("a", 5), ("b", 1), ("b", 3), ("a", 4), ("a", 6),
                                ("c", None), ("c", 0)):
        gaps.note(publisher, sequence)
    assert gaps.lost == 2 + 1    # a: 3 and 4 when 5 came (4 came late, still counted); b: 2
    assert gaps.note("b", 7) == 3


def test_a_missing_detector_stops_slowing_captions_after_k_misses_and_is_waited_for_again():
    """Issue 42: with no detector publishing, every frame used to wait the full detections_wait
    (10 -> 4.3 captions/s). Now K frames in a row without a match end the waiting, said once;
    a match resumes it."""
    import time

    import numpy as np

    from edgecap.ros2.detections import DetectionMatcher

    params = check_all({"bundle": "b", "detections_wait": 0.2, "detections_misses": 3})
    objects, logged = StampedObjects(), []
    matcher = DetectionMatcher(objects, lambda: params, log=logged.append)

    def frame(stamp_ns):
        return NS(image=np.zeros((10, 20, 3), np.uint8), stamp=NS(header_ns=stamp_ns))

    waits = []
    for i in range(6):
        start = time.monotonic()
        assert matcher([frame(i * 10**9)]) == [None]
        waits.append(time.monotonic() - start)
    assert all(w >= 0.19 for w in waits[:3]) and all(w < 0.1 for w in waits[3:]), waits
    assert not matcher.waiting and len(logged) == 1 and "last 3 frames" in logged[0]
    objects.add(7 * 10**9, [("cup", (0.0, 0.0, 9.0, 4.0), None)])
    [[cup]] = matcher([frame(7 * 10**9)])
    assert cup.cls == "cup" and cup.area == 0.25 and matcher.waiting and "match again" in logged[-1]
    health = matcher.health(time.monotonic())
    assert health["detections_matched_share"] == "0.14" and health["detections_waiting"] == "true"
    threading.Timer(0.05, objects.close).start()    # a stop ends a wait at once
    start = time.monotonic()
    matcher([frame(99 * 10**9)])
    assert time.monotonic() - start < 0.15


def test_detections_topic_boxes_are_clipped_and_those_wholly_outside_left_out_and_counted():
    """As a --detections file's (contract.objects.objects_in_view): a box reaching past an edge
    counts by its visible part, one with no part in the frame is no object in view (it used to
    be kept with area 0), and the count reaches the summary's report."""
    import numpy as np

    from edgecap.ros2.detections import DetectionMatcher

    params = check_all({"bundle": "b", "detections_wait": 0.0})
    objects = StampedObjects()
    matcher = DetectionMatcher(objects, lambda: params)
    objects.add(5, [("cup", (-10.0, -10.0, 9.0, 4.0), None), ("dog", (30.0, 0.0, 40.0, 5.0), None),
                    ("cat", (-20.0, -20.0, -1.0, -1.0), None)])
    [[cup]] = matcher([NS(image=np.zeros((10, 20, 3), np.uint8), stamp=NS(header_ns=5))])
    assert cup.cls == "cup" and cup.box == (0.0, 0.0, 9.0, 4.0) and cup.area == 0.25
    assert objects.report()["boxes_outside_frame"] == 2


@pytest.mark.parametrize(("camera", "extra", "level", "message"), [
    (dict(age_s=0.1, period_s=0.1, rate=10.0, received=50, refused=0), {}, 0, "captioning"),
    (dict(age_s=None, period_s=None, rate=None, received=0, refused=0), {"waited": 1.0}, 1, "no image on /c yet, 1.0 s"),
    (dict(age_s=None, period_s=None, rate=None, received=0, refused=0), {"waited": 6.0}, 2, "no image on /c after 6.0 s"),
    (dict(age_s=0.8, period_s=0.1, rate=8.0, received=50, refused=0), {}, 1, "/c: last image 0.8 s old"),
    (dict(age_s=5.5, period_s=0.1, rate=None, received=50, refused=0), {}, 2, "no image on /c for 5.5 s"),
    (dict(age_s=0.1, period_s=0.1, rate=10.0, received=9, refused=9), {}, 2, "every frame on /c refused"),
    (dict(age_s=0.1, period_s=0.1, rate=10.0, received=50, refused=0), {"loss": 0.9}, 1, "90% of the frames lost"),
    (dict(age_s=0.1, period_s=0.1, rate=10.0, received=50, refused=0), {"captions": 0.5, "min_rate": 2.0},
     1, "0.50 captions/s < min_rate 2"),
    (dict(age_s=0.1, period_s=0.1, rate=10.0, received=50, refused=0), {"detections": False}, 1,
     "detections stopped matching"),
])
def test_diagnostics_levels_tell_the_truth(camera, extra, level, message):
    """Issue 42: a silent camera, 92% loss, a dead detector all used to say OK."""
    from edgecap.ros2.stats import CameraHealth, health

    params = check_all({"bundle": "b", "min_rate": extra.get("min_rate", 0.0)})
    got = health([CameraHealth("/c", **camera)], extra.get("captions", 5.0), extra.get("loss"), params,
                 extra.get("waited", 30.0), paused=False, detections_waiting=extra.get("detections", True))
    assert got[0] == level and message in got[1], got


def test_loss_is_counted_over_the_window_from_sequence_gaps():
    from edgecap.ros2.stats import NodeStats
    from edgecap.runtime.records import Summary

    stats = NodeStats(Summary("x"))
    gaps = SequenceGaps()
    for sequence in (1, 2, 12, 13):          # 9 of 13 published frames lost on the way
        stats.arrived(gaps.note("p", sequence), now=stats.summary.started + 1)
    assert stats.lost == 9 and stats.loss_share(stats.summary.started + 1) == pytest.approx(9 / 13)
    assert stats.loss_share(stats.summary.started + 20) is None   # out of the window


def test_loss_is_the_larger_of_the_sequence_gaps_and_the_middlewares_lost_messages():
    """Issue 42: 9 of 120 frames arrived and `lost` said 23, the frames after the last arrival
    uncounted. The rmw's message-lost events count those (DDS saw their fragments), not the
    frames the reader's history overwrote, which the gaps count: per camera, the larger."""
    from edgecap.ros2.stats import NodeStats
    from edgecap.runtime.camera import GrabberStats
    from edgecap.runtime.records import Summary

    stats = NodeStats(Summary("x"))
    stats.summary.grabber = GrabberStats()
    t = stats.summary.started + 1
    assert dict(stats.values({}))["lost_middleware"] == "-"       # an rmw without the event
    stats.counts_middleware_loss()
    front, rear = SequenceGaps(), SequenceGaps()
    for sequence in (1, 2, 12):                                 # front: 9 missing between arrivals
        stats.arrived(front.note("p", sequence), now=t, camera=0)
    for count in (5, 6, 97):                                    # ... and 108 lost as DDS saw it
        stats.lost_by_middleware(count, now=t, camera=0)
    for sequence in (1, 5):                                     # rear: 3 overwritten in the reader
        stats.arrived(rear.note("q", sequence), now=t, camera=1)
    stats.lost_by_middleware(1, now=t, camera=1)
    assert stats.lost == 108 + 3
    values = dict(stats.values({}))
    assert (values["lost"], values["lost_gaps"], values["lost_middleware"]) == ("111", "12", "109")
    assert stats.loss_share(t) == pytest.approx(109 / (5 + 109))  # the window takes the larger too
    assert stats.loss_share(t + 20) is None


def test_the_next_caption_goes_to_the_caller_waiting_for_it():
    from edgecap.ros2.messages import NextCaption

    next_caption, stop = NextCaption(), threading.Event()
    next_caption("before anyone asked")                  # nobody waiting: not kept
    assert not next_caption.pending
    threading.Timer(0.1, next_caption, ("the next one",)).start()
    assert next_caption.wait(5.0, stop) == "the next one" and not next_caption.pending
    assert next_caption.wait(0.05, stop) is None


def test_the_launch_file_starts_edgecap_ros2_with_its_parameters(monkeypatch):
    """The launch file for /opt/ros users (the `launch` packages have no PyPI wheels, so their
    classes are stood in for by recorders here): each node it declares is `edgecap ros2` with
    arguments the command parses, the shipped parameters file and the bundle argument."""
    import argparse
    import importlib.util
    import sys
    import types

    from edgecap.ros2.command import SHARE, add_arguments

    def recorder(name):
        return type(name, (), {"__init__": lambda self, *a, **kw: setattr(self, "kw", {"args": a, **kw})})

    modules = {"launch": ["LaunchDescription"], "launch.actions": ["DeclareLaunchArgument"],
               "launch.conditions": ["IfCondition", "UnlessCondition"],
               "launch.substitutions": ["LaunchConfiguration"], "launch_ros.actions": ["Node"]}
    for name, classes in {**modules, "launch_ros": []}.items():
        module = types.ModuleType(name)
        for cls in classes:
            setattr(module, cls, recorder(cls))
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("launch_file", SHARE / "edgecap_ros2.launch.py")
    launch_file = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch_file)
    [actions] = launch_file.generate_launch_description().kw["args"]
    declared = {a.kw["args"][0]: a.kw.get("default_value") for a in actions if type(a).__name__ == "DeclareLaunchArgument"}
    assert declared == {"bundle": None, "namespace": "/camera", "params_file": str(SHARE / "edgecap-ros2.yaml"),
                        "lifecycle": "false"}
    nodes = [a.kw for a in actions if type(a).__name__ == "Node"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert [parser.parse_args(n["arguments"][1:]).lifecycle for n in nodes] == [False, True]
    assert all(n["executable"] == "edgecap" and n["arguments"][0] == "ros2" and n["name"] == "edgecap_captioner"
               for n in nodes)
    assert all(set(n["parameters"][1]) == {"bundle"} for n in nodes)


# -- frames from a real log, messages built, the robot launcher ------------------------------------
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
