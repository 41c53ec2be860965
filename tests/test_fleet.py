"""`edgecap fleet` on a local Ray cluster (2 CPUs, a small object store, shut down at the end of
the module) over logs of every format `edgecap run` reads, written by rosbags' and
mcap-ros2-support's own writers: captions equal to `edgecap run`'s, the Parquet dataset read by
pyarrow, a damaged log and a damaged frame counted and named, a kill mid-job resumed, and the
one-line refusals that come before any Ray work."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("rosbags")
pytest.importorskip("mcap_ros2")

import pyarrow.dataset as pads  # noqa: E402
from runtime_helpers import hidden_leftovers  # noqa: E402
from test_ros_logs import (  # noqa: E402
    COMPRESSED,
    IMAGE,
    compressed_msg,
    frames,
    image_msg,
    write_mcap,
    write_rosbag2,
)

from edgecap.errors import EdgecapError  # noqa: E402
from edgecap.fleet.job import FleetOptions, run_fleet  # noqa: E402
from edgecap.fleet.outputs import DATASET_COLUMNS, caption_count  # noqa: E402
from edgecap.fleet.plan import Layout, stream_name  # noqa: E402
from edgecap.io import stop_signal_handlers_kept  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CUP = [{"class": "cup", "box": [6, 4, 13, 9]}, {"class": "bottle", "box": [20, 10, 30, 20]}]


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module: edgecap fleet uses a connection it finds."""
    import ray

    with stop_signal_handlers_kept():  # or Ray's SIGTERM handler outlives the module (test_io's tests)
        ray.init(num_cpus=2, object_store_memory=100 * 1024 * 1024, include_dashboard=False,
                 logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from tests._export_util import cnn_bundle

    return cnn_bundle(tmp_path_factory.mktemp("fleet-bundle"))  # batch 2, beam 2


def _ros1_bag(path, n):
    """A ROS 1 .bag with rosbags' own rosbag1 writer (Noetic messages)."""
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    types = store.types
    with Writer(path) as writer:
        conn = writer.add_connection("/camera/image_raw", IMAGE, typestore=store)
        for i, (stamp, log_time, image) in enumerate(frames(n)):
            sec, nsec = divmod(stamp, 1_000_000_000)
            rgb = np.ascontiguousarray(image[:, :, ::-1])
            header = types["std_msgs/msg/Header"](seq=i, stamp=types["builtin_interfaces/msg/Time"](sec=sec, nanosec=nsec),
                                                  frame_id="camera_optical")
            msg = types[IMAGE](header=header, height=rgb.shape[0], width=rgb.shape[1], encoding="rgb8",
                               is_bigendian=0, step=rgb.shape[1] * 3, data=rgb.reshape(-1))
            writer.write(conn, log_time, store.serialize_ros1(msg, IMAGE))
    return path


def _camera(n, make=image_msg, shift=0):
    return [(log, make(stamp, np.roll(img, shift, axis=1))) for stamp, log, img in frames(n)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A robot's logs: rosbag2 SQLite3, rosbag2 MCAP with two cameras, a bare .mcap of
    CompressedImage with one frame that does not decode, a ROS 1 .bag, a video, a log that is
    not one, and (given on its own) an image folder; with detections for one log."""
    import cv2

    root = tmp_path_factory.mktemp("fleet")
    logs = root / "robot1"
    logs.mkdir()
    write_rosbag2(logs / "run_sqlite", "sqlite3", {"/camera/image_raw": (IMAGE, _camera(7))})
    write_rosbag2(logs / "run_two_cameras", "mcap", {"/front/image_raw": (IMAGE, _camera(6)),
                                                     "/rear/image_raw": (IMAGE, _camera(5, shift=9))})
    compressed = _camera(6, compressed_msg, shift=3)
    compressed[2] = (compressed[2][0], compressed_msg(frames(6)[2][0], None, data=b"not an image"))
    write_mcap(logs / "compressed.mcap", {"/camera/image/compressed": (COMPRESSED, compressed)})
    _ros1_bag(logs / "noetic.bag", 5)
    (logs / "junk.mcap").write_bytes(b"\x89MCAP0\r\n" + b"\x00garbage" * 100)
    video = cv2.VideoWriter(str(logs / "clip.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 10.0, (32, 24))
    for _, _, image in frames(4):
        video.write(image)
    video.release()
    images = root / "snapshots"
    images.mkdir()
    for i, (_, _, image) in enumerate(frames(3)):
        cv2.imwrite(str(images / f"snap_{i}.png"), image)
    detections = root / "detections" / "robot1"
    detections.mkdir(parents=True)
    (detections / "noetic.jsonl").write_text("\n".join(
        json.dumps({"frame_id": i, "objects": CUP}) for i in range(5)) + "\n")
    return root


def _options(bundle, root, out, **extra):
    return FleetOptions(bundle=str(bundle), logs=[str(root / "robot1"), str(root / "snapshots")], out=str(out),
                        all_topics=True, detections=str(root / "detections"), quiet=True, **extra)


@pytest.fixture(scope="module")
def done(cluster, bundle, fleet, tmp_path_factory):
    out = tmp_path_factory.mktemp("fleet-out") / "out"
    text = io.StringIO()
    summary = run_fleet(_options(bundle, fleet, out, actors=2), out=text)
    return out, summary, text.getvalue()


def _dataset(out):
    return pads.dataset(out / "dataset", format="parquet").to_table()


def test_the_dataset_reads_with_pyarrow_and_has_the_documented_columns(done):
    out, summary, _ = done
    table = _dataset(out)
    assert table.column_names == [name for name, _ in DATASET_COLUMNS]
    docs = (REPO / "docs" / "fleet.md").read_text()
    assert all(f"`{name}`" in docs for name, _ in DATASET_COLUMNS)
    rows = table.to_pylist()
    by_log = {}
    for row in rows:
        by_log.setdefault((row["log_key"], row["topic"]), []).append(row["frame_index"])
    assert by_log == {("robot1/clip.mp4", None): [0, 1, 2, 3],
                      ("robot1/compressed.mcap", "/camera/image/compressed"): [0, 1, 3, 4, 5],
                      ("robot1/noetic.bag", "/camera/image_raw"): [0, 1, 2, 3, 4],
                      ("robot1/run_sqlite", "/camera/image_raw"): list(range(7)),
                      ("robot1/run_two_cameras", "/front/image_raw"): list(range(6)),
                      ("robot1/run_two_cameras", "/rear/image_raw"): list(range(5)),
                      ("snapshots", None): [0, 1, 2]}
    assert summary["images_captioned"] == len(rows) == 35
    assert {r["bundle_sha256"] for r in rows} == {summary["bundle_sha256"]}
    assert {r["edgecap_version"] for r in rows} == {summary["edgecap"]}
    assert all(r["caption"] and r["beam"] == 2 and r["beam_score"] < 0 for r in rows)
    snap = [r for r in rows if r["log_key"] == "snapshots"]
    assert [r["image_id"] for r in snap] == ["snap_0.png", "snap_1.png", "snap_2.png"]
    assert all(r["header_stamp_ns"] is None for r in snap)


def _run(run_cli, bundle, source, tmp_path, *flags):
    """`edgecap run --replay fast` (the command line, in-process): (records, caption log path)."""
    jsonl, mcap = tmp_path / "run.jsonl", tmp_path / "run.mcap"
    code, _, stderr = run_cli("run", bundle, "--source", source, "--replay", "fast", "--jsonl", jsonl,
                              "--out-mcap", mcap, "--quiet", *flags)
    assert code == 0, stderr
    return [json.loads(line) for line in jsonl.read_text().splitlines()], mcap


def _caption_log(path):
    from rosbags.highlevel import AnyReader

    out = {}
    with AnyReader([Path(path)]) as reader:
        for conn, log_time, raw in reader.messages():
            msg = reader.deserialize(raw, conn.msgtype)
            out.setdefault(conn.topic, []).append((log_time, msg.data if conn.topic == "/edgecap/caption" else None))
    return out


@pytest.mark.parametrize("key, topic", [
    ("robot1/run_sqlite", "/camera/image_raw"), ("robot1/run_two_cameras", "/front/image_raw"),
    ("robot1/run_two_cameras", "/rear/image_raw"), ("robot1/compressed.mcap", "/camera/image/compressed"),
    ("robot1/noetic.bag", "/camera/image_raw"), ("robot1/clip.mp4", None), ("snapshots", None)])
def test_captions_and_caption_logs_are_those_of_edgecap_run(done, bundle, fleet, tmp_path, run_cli, key, topic):
    out, _, _ = done
    flags = ["--topic", topic] if topic else []
    if key == "robot1/noetic.bag":
        flags += ["--detections", fleet / "detections" / "robot1" / "noetic.jsonl"]
    records, mcap = _run(run_cli, bundle, fleet / key, tmp_path, *flags)
    rows = [r for r in _dataset(out).to_pylist() if r["log_key"] == key and r["topic"] == topic]
    assert [(r["frame_index"], r["caption"], r["tokens"]) for r in rows] == \
        [(r["frame_id"], r["caption"], r["tokens"]) for r in records]
    assert [r["header_stamp_ns"] for r in rows] == [r.get("header_stamp_ns") for r in records]
    assert [r["coverage"] and {k: round(v, 6) for k, v in r["coverage"]} for r in rows] == \
        [r.get("coverage") for r in records]  # the records round to 6 places, the dataset keeps all
    ours = Layout(out).caption_log(key, topic)
    assert ours.name == f"{stream_name(topic)}.mcap"
    theirs, mine = _caption_log(mcap), _caption_log(ours)
    if topic:  # stamped like the images; a folder's frames have only their capture time
        assert mine == theirs
    assert [c for _, c in mine["/edgecap/caption"]] == [r["caption"] for r in records]


def test_objects_and_coverage_where_a_log_has_detections(done):
    out, _, _ = done
    rows = _dataset(out).to_pylist()
    scored = [r for r in rows if r["coverage"] is not None]
    assert {r["log_key"] for r in scored} == {"robot1/noetic.bag"} and len(scored) == 5
    for row in scored:
        assert [o["class"] for o in row["objects"]] == ["cup", "bottle"]
        assert set(dict(row["coverage"])) == {">1%", ">3%", ">5%", ">10%"}
        assert isinstance(row["mentioned"], list)
    assert all(r["objects"] is None and r["mentioned"] is None for r in rows if r["coverage"] is None)


def test_a_damaged_log_and_a_damaged_frame_are_named_counted_skips(done):
    out, summary, text = done
    assert summary["logs"] == {"in_job": 7, "finished_before": 0, "captioned": 6, "failed": 1, "left": 0}
    [failure] = summary["failures"]
    assert failure["log"] == "robot1/junk.mcap" and "not a readable MCAP file" in failure["error"]
    assert "failed: robot1/junk.mcap: log " in text
    assert not Layout(out).part("robot1/junk.mcap").exists()
    assert summary["frames_skipped"] == 1
    [compressed] = [log for log in summary["per_log"] if log["log"] == "robot1/compressed.mcap"]
    [stream] = compressed["streams"]
    assert stream["skipped"] == 1 and "message 2" in stream["skips"][0]
    json.loads((out / "summary.json").read_text())  # the same summary, on disk
    assert summary["actors"] and sum(a["captions"] for a in summary["actors"]) >= 35


def test_a_second_run_finds_every_log_finished_and_changes_nothing(done, bundle, fleet):
    out, _, _ = done
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "summary.json"}
    text = io.StringIO()
    summary = run_fleet(_options(bundle, fleet, out), out=text)
    # the damaged log is not finished, so it is tried again (and fails again): the rest is skipped
    assert summary["logs"] == {"in_job": 7, "finished_before": 6, "captioned": 0, "failed": 1, "left": 0}
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "summary.json"} == files
    caption_logs = [p for p in files if p.suffix == ".mcap"]
    assert len(caption_logs) == 7 and all(caption_count(p) > 0 for p in caption_logs)


def test_a_second_job_on_the_same_out_is_refused_while_the_first_runs(done, bundle, fleet):
    from edgecap.io import WorkDir

    out, _, _ = done
    running = WorkDir(Layout(out).job_file, "--out", exclusive=True)  # what a running job holds
    try:
        with pytest.raises(EdgecapError, match=r"fleet.json is being written by another process \(pid "):
            run_fleet(_options(bundle, fleet, out), out=io.StringIO())
    finally:
        running.close()


def test_a_run_with_other_settings_is_refused_before_any_work(done, bundle, fleet):
    out, _, _ = done
    with pytest.raises(EdgecapError, match=r"holds a job made with beam = 2; this run has 1"):
        run_fleet(_options(bundle, fleet, out, beam=1), out=io.StringIO())


def _many_logs(root, count, n):
    root.mkdir()
    for i in range(count):
        write_mcap(root / f"log_{i:02d}.mcap", {"/camera/image_raw": (IMAGE, _camera(n, shift=i))})
    return root


@contextlib.contextmanager
def _fleet_with_a_log_finished(cluster, bundle, logs, out):
    """`edgecap fleet` in its own process group on the module's cluster, handed over once its
    first log is finished (or it ended, or 240 s passed); the group is killed at the end."""
    argv = [sys.executable, "-m", "edgecap.cli", "fleet", bundle, logs, "--out", out, "--address", cluster,
            "--actors", "1", "--quiet"]
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline and not any((out / "dataset" / "logs").glob("*.parquet")):
            time.sleep(0.02)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):  # (gone already: its output says why)
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_job_killed_mid_way_is_resumed_for_exactly_the_missing_logs(cluster, bundle, tmp_path, capsys):
    logs = _many_logs(tmp_path / "logs", 8, 150)
    out = tmp_path / "out"
    with _fleet_with_a_log_finished(cluster, bundle, logs, out) as proc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and anything it started, at once
        output, _ = proc.communicate(timeout=60)
    layout = Layout(out)
    before = {p.stem for p in (out / "dataset" / "logs").glob("*.parquet")}
    assert before, f"exit {proc.returncode}: {output.decode()[-3000:]}"
    assert len(before) < 8, "the job finished before it could be killed; give it more to do"
    capsys.readouterr()
    summary = run_fleet(FleetOptions(bundle=str(bundle), logs=[str(logs)], out=str(out)), out=io.StringIO())
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("edgecap fleet: [")]
    left = 8 - len(before)  # not a terminal: a line per log, with the images so far, the rate and an ETA
    assert [line.split("]")[0] for line in progress] == [f"edgecap fleet: [{i}/{left}" for i in range(1, left + 1)]
    assert all("150 captions; " in line and " images captioned" in line for line in progress)
    assert "captions/s" in progress[-1] and ("ETA " in progress[0] or left == 1)
    assert summary["logs"]["finished_before"] == len(before)
    assert {log["log"] for log in summary["per_log"]} == {f"logs/log_{i:02d}.mcap" for i in range(8)} - {
        f"logs/{stem}" for stem in before}
    assert summary["logs"]["failed"] == 0 and summary["logs"]["left"] == 0
    # the same dataset as one uninterrupted run: every frame of every log once, in order
    table = _dataset(out).to_pylist()
    assert sorted((r["log_key"], r["frame_index"]) for r in table) == [
        (f"logs/log_{i:02d}.mcap", k) for i in range(8) for k in range(150)]
    for i in range(8):
        assert caption_count(layout.caption_log(f"logs/log_{i:02d}.mcap", "/camera/image_raw")) == 150
    for folder in [out, out / "dataset" / "logs", *(out / "captions" / "logs").iterdir()]:
        assert hidden_leftovers(folder) == []  # the killed writer's work directories were removed


def test_sigterm_mid_job_ends_it_as_any_edgecap_command_ends(cluster, bundle, tmp_path):
    """ray.init makes the driver's SIGTERM a bare sys.exit; edgecap's handling is put back, so a
    service manager's stop gives exit 143, one line, and a summary saying a signal stopped it."""
    logs = _many_logs(tmp_path / "logs", 8, 150)
    out = tmp_path / "out"
    with _fleet_with_a_log_finished(cluster, bundle, logs, out) as proc:
        proc.send_signal(signal.SIGTERM)  # the driver only, as systemd's first stop does
        output, _ = proc.communicate(timeout=120)
    text = output.decode()
    assert proc.returncode == 143, text[-3000:]
    assert "edgecap fleet: terminated (SIGTERM)" in text and "Traceback" not in text
    summary = json.loads(Layout(out).summary.read_text())
    assert summary["stopped_by"] == "signal" and summary["logs"]["left"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--topic", "/a", "-a"], "--topic and --all-topics both choose topics"),
    (["--categories", "names.yaml"], "--categories applies to COCO results in --detections"),
    (["--address", "auto", "--num-cpus", "2"], "--num-cpus and --object-store-mb size the local cluster"),
])
def test_contradicting_options_are_one_line(run_cli, bundle, fleet, tmp_path, argv, message):
    code, _, stderr = run_cli("fleet", bundle, fleet / "robot1", "--out", tmp_path / "out", *argv)
    assert code == 1 and message in stderr and stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_an_out_folder_that_is_not_a_fleet_output_is_refused(run_cli, bundle, fleet, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    code, _, stderr = run_cli("fleet", bundle, fleet / "robot1", "--out", mine)
    assert code == 1 and "holds no fleet.json of edgecap fleet; not writing into it" in stderr
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_logs_that_are_not_logs_are_one_line(run_cli, bundle, tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    for target, message in ((tmp_path / "missing", "no such file or directory"),
                            (tmp_path / "notes.txt", "not a robot log"),
                            (tmp_path / "empty", "no robot logs")):
        code, _, stderr = run_cli("fleet", bundle, target, "--out", tmp_path / "out")
        assert code == 1 and message in stderr and stderr.count("\n") == 1


def test_a_folder_is_one_recording_or_a_folder_of_logs(tmp_path):
    from edgecap.fleet.plan import discover

    fleet = tmp_path / "fleet"
    (fleet / "robot1" / "bag").mkdir(parents=True)
    (fleet / "robot1" / "bag" / "bag_0.mcap").write_bytes(b"")         # killed before metadata.yaml
    (fleet / "robot1" / "bag" / "bag_1.mcap").write_bytes(b"")
    (fleet / "robot2").mkdir()
    for name in ("morning.mcap", "evening.bag", "clip.mp4", "notes.txt", ".hidden.mcap"):
        (fleet / "robot2" / name).write_bytes(b"")
    found = discover([str(fleet)], tmp_path / "out")
    assert [(log.key, log.kind) for log in found] == [
        ("fleet/robot1/bag", "log"), ("fleet/robot2/clip.mp4", "video"), ("fleet/robot2/evening.bag", "log"),
        ("fleet/robot2/morning.mcap", "log")]
    twice = discover([str(fleet / "robot2"), str(fleet / "robot2" / "evening.bag")], tmp_path / "out")
    assert [log.key for log in twice] == ["robot2/clip.mp4", "robot2/evening.bag", "robot2/morning.mcap"]
    with pytest.raises(EdgecapError, match="would both be named 'morning.mcap'"):
        other = tmp_path / "other"
        other.mkdir()
        (other / "morning.mcap").write_bytes(b"")
        discover([str(fleet / "robot2" / "morning.mcap"), str(other / "morning.mcap")], tmp_path / "out")
    with pytest.raises(EdgecapError, match="is inside --out"):
        discover([str(fleet)], fleet)


def test_actor_resources_follow_the_bundles_providers_and_never_starve_the_readers():
    from types import SimpleNamespace

    from edgecap.fleet.job import READ_CPUS, actor_resources, pool_size

    cpu_bundle = SimpleNamespace(graphs=[SimpleNamespace(engine="onnxruntime")])
    trt_bundle = SimpleNamespace(graphs=[SimpleNamespace(engine="onnxruntime"), SimpleNamespace(engine="tensorrt")])
    options = FleetOptions(bundle="b", logs=[], out="o")
    cpu = actor_resources(cpu_bundle, options)
    assert (cpu.device, cpu.num_cpus, cpu.num_gpus, cpu.providers) == ("cpu", 0.5, 0.0, ["CPUExecutionProvider"])
    assert pool_size(cpu, {"CPU": 2.0}, None, 1) == 2 and 2 * cpu.num_cpus + READ_CPUS <= 2
    gpu = actor_resources(trt_bundle, options)
    assert (gpu.device, gpu.num_gpus) == ("gpu", 1.0)
    assert pool_size(gpu, {"CPU": 16.0, "GPU": 4.0}, None, 1) == 4  # an actor per GPU
    cuda = actor_resources(cpu_bundle, FleetOptions(bundle="b", logs=[], out="o",
                                                    providers=["CUDAExecutionProvider", "CPUExecutionProvider"]))
    assert cuda.device == "gpu" and cuda.providers[0] == "CUDAExecutionProvider"
    with pytest.raises(EdgecapError, match="the Ray cluster has no GPUs"):
        pool_size(gpu, {"CPU": 2.0}, None, 1)
    whole = actor_resources(cpu_bundle, FleetOptions(bundle="b", logs=[], out="o", actor_cpus=1.0))
    with pytest.raises(EdgecapError, match="the read tasks would starve"):  # issue 37's trap: 2 x 1 CPU on 2 CPUs
        pool_size(whole, {"CPU": 2.0}, 2, 1)


def test_the_gatherer_waits_for_every_announced_frame_and_drops_repeats():
    import pyarrow as pa

    from edgecap.fleet.actor import caption_schema
    from edgecap.fleet.outputs import Gatherer
    from edgecap.fleet.plan import LogInput

    def rows(*items):
        return pa.Table.from_pylist([dict.fromkeys(caption_schema().names) | item for item in items],
                                    schema=caption_schema())

    end = {"kind": "end", "unit": 0, "topic": "", "index": -1, "info": json.dumps(
        {"source": "a", "error": None, "streams": [{"topic": "/c", "frames": 2, "skipped": 0, "skips": []}]})}
    gatherer = Gatherer({0: LogInput("/a.mcap", "a.mcap", "log"), 1: LogInput("/b.mcap", "b.mcap", "log")})
    frame = {"kind": "frame", "unit": 0, "topic": "/c", "caption": "x"}
    assert gatherer.add(rows(end, {**frame, "index": 1})) == []                # the END row came first
    assert gatherer.add(rows({**frame, "index": 1})) == []                     # a retried task's repeat
    [state] = gatherer.add(rows({**frame, "index": 0}))
    assert state.log.key == "a.mcap" and [r["index"] for r in state.stream_rows("/c")] == [0, 1]
    failed = {"kind": "end", "unit": 1, "topic": "", "index": -1,
              "info": json.dumps({"source": "b", "error": "broken", "streams": []})}
    [state] = gatherer.add(rows(failed))
    assert state.error == "broken" and gatherer.open == {}
    assert gatherer.add(rows({**frame, "unit": 1, "index": 0})) == []          # a failed log's late row


def test_without_the_fleet_extra_the_command_names_it(run_cli, bundle, fleet, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    code, _, stderr = run_cli("fleet", bundle, fleet / "robot1", "--out", tmp_path / "out")
    assert code == 1 and stderr.count("\n") == 1 and 'pip install "edgecap[fleet]"' in stderr
    assert not (tmp_path / "out").exists()
