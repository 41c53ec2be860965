"""The ROS 2 node on a live graph: real rclpy from PyPI (`pip install "edgecap[ros2]"`), the node in
its own process, a camera and a listener in theirs (tests/ros2_peer.py). Each test has its own
ROS_DOMAIN_ID and discovers on localhost only, so runs on one machine do not see each other.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 Python (pip install \"edgecap[ros2]\")")

REPO = Path(__file__).resolve().parents[1]
PEER = REPO / "tests" / "ros2_peer.py"
START_S = 90.0            # a node's start on a loaded 2-core CI machine: imports, bundle, warm-up
_domains = itertools.count(30 + os.getpid() % 60)


@pytest.fixture(scope="session")
def demo_bundle(tmp_path_factory):
    """The demo model exported once per session (a few seconds), two images a batch."""
    from edgecap.cli import main

    out = tmp_path_factory.mktemp("ros2") / "demo"
    demo = REPO / "edgecap" / "assets" / "demo-smart.pt"
    assert main(["export", str(demo), "--engine", "onnx", "--batch", "2", "--beam", "3", "--samples", "1",
                 "--out", str(out), "--quiet"]) == 0
    return out


class Proc:
    """A process of the graph, its stdout and stderr in files."""

    def __init__(self, cmd, env, tmp: Path, name: str):
        self.out, self.err = tmp / f"{name}.out", tmp / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.popen = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=REPO)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = START_S) -> None:
        end = time.monotonic() + timeout
        while text not in self.stderr():
            if self.popen.poll() is not None:
                raise AssertionError(f"exited {self.popen.returncode} before {text!r}:\n{self.stderr()}")
            if time.monotonic() > end:
                raise AssertionError(f"no {text!r} after {timeout:.0f} s:\n{self.stderr()}")
            time.sleep(0.1)

    def stop(self, signum=signal.SIGINT, timeout: float = 10.0) -> tuple[int, float]:
        """(exit code, seconds from the signal to the exit)."""
        start = time.monotonic()
        self.popen.send_signal(signum)
        code = self.popen.wait(timeout)
        return code, time.monotonic() - start

    def result(self, timeout: float = 120.0) -> dict:
        code = self.popen.wait(timeout)
        assert code == 0, self.stderr()
        return json.loads(self.stdout().strip().splitlines()[-1])


class Graph:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.domain = next(_domains)
        self.env = {**os.environ, "ROS_DOMAIN_ID": str(self.domain),
                    "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "PYTHONUNBUFFERED": "1",
                    "RCUTILS_COLORIZED_OUTPUT": "0",
                    "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        self.procs: list[Proc] = []
        self._names = itertools.count()

    def spawn(self, cmd, name) -> Proc:
        proc = Proc(cmd, self.env, self.tmp, f"{name}{next(self._names)}")
        self.procs.append(proc)
        return proc

    def node(self, bundle, *params, ns: str = "/cam", module: bool = False) -> Proc:
        ros = ["--ros-args", "-r", f"__ns:={ns}", *(a for p in params for a in ("-p", p))]
        cmd = ([sys.executable, "-m", "edgecap.ros2", *ros, "-p", f"bundle:={bundle}"] if module else
               [sys.executable, "-m", "edgecap", "ros2", str(bundle), *ros])
        return self.spawn(cmd, "node")

    def listen(self, *namespaces, records: int = 0, seconds: float = 40.0) -> Proc:
        proc = self.spawn([sys.executable, str(PEER), "listen", *(a for ns in namespaces for a in ("--ns", ns)),
                           "--records", str(records), "--seconds", str(seconds)], "listen")
        proc.wait_for("listening")
        return proc

    def peer(self, *args) -> dict:
        return self.spawn([sys.executable, str(PEER), *map(str, args)], "peer").result()

    def close(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait()


@pytest.fixture
def graph(tmp_path):
    g = Graph(tmp_path)
    yield g
    g.close()


def _stopped_cleanly(proc: Proc, signum) -> str:
    code, _ = proc.stop(signum)
    err = proc.stderr()
    assert code == 0, err
    assert "Traceback" not in err and "Exception" not in err, err
    return proc.stdout()


def _frames(first: int, count: int, encoding: str, size: int = 96):
    """The images the camera peer sends, as the node sees them (jpeg decoded)."""
    import cv2

    sys.path.insert(0, str(PEER.parent))
    from ros2_peer import frame

    images = [frame(i, size, size, 11)[0] for i in range(first, first + count)]
    if encoding == "jpeg":
        images = [cv2.imdecode(cv2.imencode(".jpg", im)[1], cv2.IMREAD_COLOR) for im in images]
    return images


def test_two_namespaced_nodes_caption_raw_and_jpeg_frames_with_their_stamps(graph, demo_bundle):
    from edgecap.runtime.captioner import Captioner

    reliable = ("qos:=reliable", "qos_depth:=3")    # no frame lost, whatever the machine's load
    raw = graph.node(demo_bundle, "max_rate:=5", *reliable, ns="/raw")     # 5: an int is a rate
    jpeg = graph.node(demo_bundle, "compressed:=true", *reliable, ns="/jpeg", module=True)
    for node in (raw, jpeg):
        node.wait_for("captioning")
    listener = graph.listen("/raw", "/jpeg", records=9)
    sent = {"rgb8": graph.peer("publish", "--topic", "/raw/image_raw", "--encoding", "rgb8",
                               "--count", 3, "--rate", 4, "--qos", "reliable")["sent"],
            "bgr8": graph.peer("publish", "--topic", "/raw/image_raw", "--encoding", "bgr8",
                               "--count", 3, "--first", 3, "--rate", 4, "--qos", "reliable")["sent"],
            "jpeg": graph.peer("publish", "--topic", "/jpeg/image_raw", "--encoding", "jpeg",
                               "--count", 3, "--rate", 4, "--qos", "reliable")["sent"]}
    got = listener.result()

    captioner = Captioner.from_bundle(demo_bundle)
    by_stamp = {ns: {r["header_stamp_ns"]: r for r in got["records"][ns]} for ns in ("/raw", "/jpeg")}
    for encoding, first, ns in (("rgb8", 0, "/raw"), ("bgr8", 3, "/raw"), ("jpeg", 0, "/jpeg")):
        expected = captioner.caption(_frames(first, 3, encoding))
        for shot, caption in zip(sent[encoding], expected, strict=True):
            record = by_stamp[ns][shot["stamp_ns"]]           # each frame captioned, by its stamp
            assert record["tokens"] == caption.tokens and record["caption"] == caption.text, encoding
            assert record["source"] == f"ros2:{ns}/image_raw"
    assert got["captions"]["/raw"] == [r["caption"] for r in got["records"]["/raw"]]

    diagnostics = got["diagnostics"]
    for ns, count in (("/raw", 6), ("/jpeg", 3)):
        status = diagnostics[f"edgecap: {ns}/edgecap_captioner"]
        values = status["values"]
        assert status["level"] == 0 and values["bundle"] == str(demo_bundle)
        assert "CPUExecutionProvider" in values["providers"] and values["image_topic"] == f"{ns}/image_raw"
        assert int(values["received"]) == int(values["captioned"]) == count
        assert float(values["latency_p50_ms"]) <= float(values["latency_p95_ms"])
        assert float(values["captions_per_s"]) > 0 and values["dropped"] == values["lost"] == "0"

    out = _stopped_cleanly(raw, signal.SIGINT)
    assert "summary: 6 frames captioned, 0 dropped" in out and "stopped by signal" in out
    assert "summary: 3 frames captioned" in _stopped_cleanly(jpeg, signal.SIGTERM)


def test_one_node_captions_two_cameras_as_one_batch(graph, demo_bundle):
    """image_topics: each take holds the newest frame of both cameras, captioned in one batch
    (so with one latency), each camera's captions beside its own topic."""
    from edgecap.runtime.captioner import Captioner

    node = graph.node(demo_bundle, "image_topics:=/front/image_raw,/rear/image_raw", "max_rate:=2",
                      ns="/")
    node.wait_for("captioning")
    listener = graph.listen("/front", "/rear", seconds=8)
    sent = graph.peer("publish", "--topic", "/front/image_raw", "--topic", "/rear/image_raw",
                      "--count", 6, "--rate", 4)["sent"]
    got = listener.result()["records"]
    captioner = Captioner.from_bundle(demo_bundle)
    for ns, first in (("/front", 0), ("/rear", 6)):
        stamps = [s["stamp_ns"] for s in sent if s["topic"] == f"{ns}/image_raw"]
        assert len(got[ns]) >= 2 and all(r["source"] == f"ros2:{ns}/image_raw" for r in got[ns])
        for record in got[ns]:
            index = stamps.index(record["header_stamp_ns"])
            assert record["tokens"] == captioner.caption(_frames(first + index, 1, "rgb8"))[0].tokens
    batched = {json.dumps(r["latency_ms"]) for r in got["/front"]} & {json.dumps(r["latency_ms"])
                                                                        for r in got["/rear"]}
    assert batched, "no caption of one camera came from the other's batch"
    out = _stopped_cleanly(node, signal.SIGINT)
    assert "summary:" in out and "stopped by signal" in out


def test_reliable_640x480_frames_are_all_captioned_at_the_rate_limit(graph, demo_bundle):
    """A burst of 15 raw 640x480 frames at 15 Hz: the reliable subscription and a queue as deep as
    the burst deliver every one, captioned no faster than max_rate."""
    node = graph.node(demo_bundle, "qos:=reliable", "qos_depth:=20", "max_rate:=5.0")
    node.wait_for("captioning")
    listener = graph.listen("/cam", records=15)
    # the camera's history as deep as the burst too: a reliable writer overwrites what is unacknowledged
    sent = graph.peer("publish", "--topic", "/cam/image_raw", "--encoding", "bgr8", "--qos", "reliable",
                      "--depth", 20, "--count", 15, "--rate", 15, "--width", 640, "--height", 480)["sent"]
    records = listener.result()["records"]["/cam"]
    assert [r["header_stamp_ns"] for r in records] == [s["stamp_ns"] for s in sent]
    done = [r["t_capture"] + r["capture_to_caption_ms"] / 1e3 for r in records]
    # the rate limit spaces the takes; one caption's latency more or less moves each end
    assert done[-1] - done[0] >= 14 / 5.0 - 0.1, done
    out = _stopped_cleanly(node, signal.SIGINT)
    assert "summary: 15 frames captioned, 0 dropped" in out
    assert "0 frames lost on the way" in out


def test_detections_give_coverage_and_annotated_images(graph, demo_bundle):
    from edgecap.runtime.scoring import CoverageAnnotator
    from edgecap.runtime.sources import KnownObject

    # detections stamped 20 ms off their image: inside the 50 ms tolerance; every other frame has none
    node = graph.node(demo_bundle, "detections_topic:=detections", "qos:=reliable", "qos_depth:=10")
    node.wait_for("captioning")
    listener = graph.listen("/cam", records=4)
    sent = graph.peer("publish", "--topic", "/cam/image_raw", "--qos", "reliable", "--count", 4,
                      "--rate", 4, "--detections", "/cam/detections", "--detect-every", 2,
                      "--detect-offset-ns", 20_000_000)["sent"]
    got = listener.result()
    records = {r["header_stamp_ns"]: r for r in got["records"]["/cam"]}
    scorer = CoverageAnnotator()
    for shot in sent:
        record = records[shot["stamp_ns"]]
        if shot["objects"] is None:
            assert "coverage" not in record and "objects" not in record
            continue
        assert [o["class"] for o in record["objects"]] == [o["class"] for o in shot["objects"]]
        objects = [KnownObject.from_record(o) for o in record["objects"]]
        coverage, matches = scorer.score(record["caption"], objects)
        assert record["coverage"] == {k: (None if v is None else round(v, 6)) for k, v in coverage.items()}
        assert record["mentioned"] == matches
    assert any(r.get("mentioned") for r in records.values())  # the demo model names what it sees
    annotated = got["annotated"]["/cam"]
    assert sorted(a["stamp_ns"] for a in annotated) == sorted(records)
    assert all(a["encoding"] == "bgr8" and a["width"] == 96 and a["height"] > 96 for a in annotated)
    out = _stopped_cleanly(node, signal.SIGINT)
    assert "detections: 2 received; frames with objects 2, without 2" in out
    assert "mean coverage" in out


def test_a_detector_on_the_node_gives_coverage_without_a_detections_topic(graph, demo_bundle, tmp_path):
    """`detector:=MODEL.onnx`: the node runs the detector on the frames it captions (here one that
    finds a cup filling every frame), so each record has its objects, coverage and the
    detector's latency."""
    from detector_models import write_detector

    model = tmp_path / "cups.onnx"
    write_detector(model, [(1, (160, 160, 320, 320), 0.9)], gated=False)
    node = graph.node(demo_bundle, f"detector:={model}", "qos:=reliable", "qos_depth:=10")
    node.wait_for("captioning")
    listener = graph.listen("/cam", records=3)
    graph.peer("publish", "--topic", "/cam/image_raw", "--qos", "reliable", "--count", 3, "--rate", 3)
    records = listener.result()["records"]["/cam"]
    assert len(records) == 3
    for record in records:
        assert [o["class"] for o in record["objects"]] == ["cup"] and record["objects"][0]["area"] == 1.0
        assert set(record["coverage"]) == {">1%", ">3%", ">5%", ">10%"}
        assert record["latency_ms"]["detector"] > 0
    out = _stopped_cleanly(node, signal.SIGINT)
    assert "mean coverage" in out


def test_parameters_change_at_run_time_through_the_callback(graph, demo_bundle):
    node = graph.node(demo_bundle, "beam:=1.0", "qos:=reliable", "qos_depth:=10")  # 1.0: an int beam
    node.wait_for("captioning")
    listener = graph.listen("/cam", records=4)
    graph.peer("publish", "--topic", "/cam/image_raw", "--qos", "reliable", "--count", 2, "--rate", 4)
    results = graph.peer("set", "--node", "/cam/edgecap_captioner", "beam=3", "beam=9", "qos=\"reliable\"",
                         "max_rate=2", "max_rate=\"fast\"")["results"]
    graph.peer("publish", "--topic", "/cam/image_raw", "--qos", "reliable", "--count", 2, "--first", 2,
               "--rate", 2)
    got = listener.result()
    assert [r["successful"] for r in results] == [True, False, False, True, False]
    assert "beam 9 out of range" in results[1]["reason"]
    assert "read" in results[2]["reason"].lower()
    assert results[4]["reason"] == "parameter max_rate: 'fast' is not a number > 0"
    assert [r["beam"] for r in got["records"]["/cam"]] == [1, 1, 3, 3]
    assert got["diagnostics"]["edgecap: /cam/edgecap_captioner"]["values"]["max_rate"] == "2"
    assert "beam is now 3" in node.stderr()
    _stopped_cleanly(node, signal.SIGTERM)


def test_sigint_and_sigterm_stop_an_idle_node_at_once_every_time(graph, demo_bundle):
    """No frames arrive, so each node waits in rcl_wait when the signal comes (where rclpy's own
    handler hung about one stop in seven). Eight nodes side by side, half of each signal."""
    nodes = [graph.node(demo_bundle, *(["max_rat:=5"] if i == 0 else []), ns=f"/idle{i}") for i in range(8)]
    for node in nodes:
        node.wait_for("captioning")
    assert "parameter 'max_rat' is not one of this node's; ignored (did you mean 'max_rate'?)" in nodes[0].stderr()
    time.sleep(1.0)
    for i, node in enumerate(nodes):
        signum = signal.SIGINT if i % 2 else signal.SIGTERM
        code, seconds = node.stop(signum)
        err = node.stderr()
        assert code == 0 and "Traceback" not in err, err
        assert seconds < 5.0, f"{signum.name}: {seconds:.1f} s to stop"   # a hang, not a speed
        assert "summary: 0 frames captioned" in node.stdout() and "stopped by signal" in node.stdout()


@pytest.mark.parametrize(("args", "message"), [
    (["ros2", "/nonexistent/bundle", "--ros-args"], "/nonexistent/bundle"),
    (["ros2", "BUNDLE", "--ros-args", "-p", "beam:=7"],
     "parameter beam: beam 7 out of range: this bundle's decoder graph was exported for beams 1..3"),
    (["ros2", "BUNDLE", "--ros-args", "-p", "max_rate:=fast"], "parameter max_rate: 'fast' is not a number > 0"),
    (["ros2", "BUNDLE", "--ros-args", "-p", "qos:=fast"],
     "parameter qos: 'fast' is not one of sensor_data, reliable"),
    (["ros2", "BUNDLE", "--ros-args", "-p", "detections_format:=vision_msgs", "-p", "detections_topic:=d"],
     "vision_msgs is not importable"),
    (["-m", "edgecap.ros2"], "parameter bundle: set it to a bundle directory"),
    (["ros2", "BUNDLE", "--ros-args", "-p", "detections_topic:=d", "-p", "detector:=yolo.onnx"],
     "parameter detector: detections_topic already gives the frames' objects"),
    (["ros2", "BUNDLE", "--ros-args", "-p", "detector:=/nonexistent/yolo.onnx"],
     "parameter detector: --detector /nonexistent/yolo.onnx: no such file"),
])
def test_start_up_errors_are_one_line_and_exit_non_zero(graph, demo_bundle, args, message):
    args = [str(demo_bundle) if a == "BUNDLE" else a for a in args]
    cmd = [sys.executable, *args] if args[0] == "-m" else [sys.executable, "-m", "edgecap", *args]
    done = subprocess.run(cmd, env=graph.env, capture_output=True, text=True, timeout=120, cwd=REPO)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("edgecap ros2: error: ") and message in lines[0]


def test_malformed_ros_arguments_end_in_rcls_reason_without_a_traceback(graph, demo_bundle):
    done = subprocess.run([sys.executable, "-m", "edgecap", "ros2", str(demo_bundle), "--ros-args", "-p", "beam"],
                          env=graph.env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("edgecap ros2: error: ROS arguments '--ros-args -p beam': failed to initialize "
                           "rcl: Couldn't parse parameter override rule: '-p beam'") and ", at /" not in last


def test_depth_images_are_refused_and_a_wrong_topic_type_is_named(graph, demo_bundle):
    depth = graph.node(demo_bundle, "qos:=reliable", "qos_depth:=10", ns="/depth")
    wrong = graph.node(demo_bundle, "no_image_warning:=1.5", ns="/wrong")
    for node in (depth, wrong):
        node.wait_for("captioning")
    graph.peer("publish", "--topic", "/depth/image_raw", "--encoding", "16UC1", "--qos", "reliable",
               "--count", 6, "--rate", 6)
    graph.peer("publish", "--topic", "/wrong/image_raw", "--encoding", "jpeg", "--count", 2,
               "--linger", 3.0)
    wrong.wait_for("carries")
    refused = [line for line in depth.stderr().splitlines() if "refused" in line]
    assert len(refused) == 1, depth.stderr()                 # one line for the burst, rate-limited
    assert "image encoding '16UC1' is not a colour image" in refused[0] and "allow_non_colour" in refused[0]
    assert ("/wrong/image_raw carries sensor_msgs/msg/CompressedImage, not sensor_msgs/msg/Image: "
            "no image can arrive; set compressed:=true") in wrong.stderr()
    assert "summary: 0 frames captioned" in (out := _stopped_cleanly(depth, signal.SIGINT))
    assert "6 frames refused (encoding)" in out
    _stopped_cleanly(wrong, signal.SIGINT)


def test_caption_logs_carry_the_type_hashes_the_ros_2_graph_announces(graph):
    """edgecap's MCAP writer stamps each channel with a RIHS01 type hash (computed by rosbags);
    a live rclpy publisher announces the hash its message package was built with."""
    from edgecap.ros.mcap_out import channel_metadata

    types = ["std_msgs/msg/String", "sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage",
             "diagnostic_msgs/msg/DiagnosticArray", "visualization_msgs/msg/ImageMarker"]
    announced = graph.peer("hashes", *types)["hashes"]
    assert {t: channel_metadata(t)["topic_type_hash"] for t in types} == announced
