"""The ROS 2 node's parts that need no ROS graph: its parameter table, detections matched by
stamp (JSON and vision_msgs' layout), its frame queue and its rate-limited warnings."""

import json
import threading
from types import SimpleNamespace as NS

import pytest

from edgecap.errors import EdgecapError
from edgecap.ros2.detections import StampedObjects, json_objects, vision_objects
from edgecap.ros2.frames import FrameQueue, take_batch
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
    ("max_rate", 0, "parameter max_rate: 0 is not a number > 0"),
    ("max_rate", "fast", "parameter max_rate: 'fast' is not a number > 0"),
    ("max_rate", float("nan"), "parameter max_rate: nan is not a number > 0"),
    ("beam", 2.5, "parameter beam: 2.5 is not an integer >= 0"),
    ("beam", True, "parameter beam: True is not an integer >= 0"),
    ("qos", "fast", "parameter qos: 'fast' is not one of sensor_data, reliable"),
    ("compressed", 1, "parameter compressed: 1 is not true or false"),
    ("qos_depth", 0, "parameter qos_depth: 0 is not an integer >= 1"),
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
    assert {k: v for k, v in checked.items() if k != "bundle"} == {
        p.name: p.default for p in PARAMS if p.name != "bundle"}


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
    assert sets.report() == {"received": 6, "matched_frames": 2, "unmatched_frames": 2}


def test_the_frame_queue_keeps_the_newest_depth_frames_and_counts_drops():
    queue = FrameQueue(depth=2)
    for i in range(5):
        queue.put(i)
    assert [queue.take(0.1), queue.take(0.1), queue.take(0.01)] == [3, 4, None]
    assert (queue.stats.captured, queue.stats.dropped, queue.stats.taken) == (5, 3, 2)
    newest = FrameQueue()
    newest.put("old")
    newest.put("new")
    assert newest.take(0.1) == "new" and newest.stats.dropped == 1


def test_queues_sharing_a_condition_give_one_frame_of_each_camera_as_a_batch():
    cond = threading.Condition()
    front, rear, side = FrameQueue(2, cond), FrameQueue(2, cond), FrameQueue(2, cond)
    front.put("f1")
    front.put("f2")
    rear.put("r1")
    assert take_batch([front, rear, side], 0.1) == [(0, "f1"), (1, "r1")]
    assert take_batch([front, rear, side], 0.1) == [(0, "f2")]
    threading.Timer(0.05, side.put, ("s1",)).start()
    assert take_batch([front, rear, side], 5.0) == [(2, "s1")]   # waits for whichever comes
    assert take_batch([front, rear, side], 0.01) == []


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
