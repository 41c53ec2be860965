"""`edgecap run` on robot logs with a real exported bundle: the synthetic world's MCAP clip
(`edgecap data synth --mcap`), one-line errors with exit code 1, and SIGTERM leaving a
finished caption log."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import hidden_leftovers, terminate_after_records

pytest.importorskip("torch")
pytest.importorskip("rosbags")
pytest.importorskip("mcap_ros2")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from tests._export_util import export, save_tiny

    root = tmp_path_factory.mktemp("bundle")
    ckpt = save_tiny(root / "tiny.pt", "smart",
                     visual={"kind": "cnn", "image_size": 16, "channels": [8, 24]}, n_regions=16)
    export(ckpt, root / "bundle")
    return root / "bundle"


@pytest.fixture(scope="module")
def synth(tmp_path_factory, run_module_cli):
    out = tmp_path_factory.mktemp("synth") / "data"
    code, stdout, stderr = run_module_cli("data", "synth", "--out", out, "--images", 4,
                                          "--sequences", 0, "--video-frames", 12, "--size", 48,
                                          "--mcap", "--quiet")
    assert code == 0, stderr
    assert f"robot log: {out / 'video' / 'tabletop.mcap'}" in stdout
    return out


@pytest.fixture(scope="module")
def run_module_cli():
    def _run(*argv):
        res = subprocess.run([sys.executable, "-m", "edgecap.cli", *map(str, argv)],
                             capture_output=True, text=True, cwd=REPO, timeout=300)
        return res.returncode, res.stdout, res.stderr
    return _run


def _read(path):
    from rosbags.highlevel import AnyReader

    out = {}
    with AnyReader([Path(path)]) as reader:
        for conn, log_time, raw in reader.messages():
            out.setdefault(conn.topic, []).append((log_time, reader.deserialize(raw, conn.msgtype)))
    return out


def test_synth_clip_log_has_images_and_camera_info_matching_the_video(synth):
    from edgecap.data.synth import TabletopWorld
    from edgecap.data.synth.rosbag import START_NS, TRANSPORT_NS
    from edgecap.ros.images import image_to_bgr

    topics = _read(synth / "video" / "tabletop.mcap")
    images, infos = topics["/camera/image_raw"], topics["/camera/camera_info"]
    assert len(images) == len(infos) == 12
    world = TabletopWorld(0, 48, 15.0)
    for t in (0, 7):
        log_time, msg = images[t]
        stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        assert stamp == START_NS + round(t * 1e9 / 15) and log_time == stamp + TRANSPORT_NS
        assert msg.encoding == "rgb8"
        assert (image_to_bgr(msg) == world.render(t).image).all()
        info = infos[t][1]
        assert info.header.stamp == msg.header.stamp and info.header.frame_id == msg.header.frame_id
        assert info.k[0] == info.k[4] == pytest.approx(world.camera(t).focal * 48)


def test_run_on_the_synth_log_writes_a_caption_log_aligned_with_it(bundle, synth, tmp_path,
                                                                    run_cli):
    log = synth / "video" / "tabletop.mcap"
    out, jsonl = tmp_path / "captions.mcap", tmp_path / "captions.jsonl"
    code, stdout, stderr = run_cli("run", bundle, "--source", log, "--replay", "fast",
                                   "--detections", synth / "video" / "tabletop.jsonl",
                                   "--no-coverage", "--out-mcap", out, "--jsonl", jsonl)
    assert code == 0, stderr
    assert "summary: 12 frames captioned, 0 dropped" in stdout
    assert f"caption log: {out} (12 captions)" in stdout
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    images = _read(log)["/camera/image_raw"]
    captions = _read(out)
    assert [t for t, _ in captions["/edgecap/caption"]] == [t for t, _ in images]
    assert [m.data for _, m in captions["/edgecap/caption"]] == [r["caption"] for r in records]
    assert [r["header_stamp_ns"] for r in records] == [
        m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec for _, m in images]
    assert len(captions["/edgecap/annotations"]) == 12  # the sidecar's ground-truth boxes


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.mcap", "no such file or directory"),
    (lambda d: _junk(d / "junk.mcap"), "not a readable MCAP file"),
])
def test_bad_logs_are_one_line_and_exit_1(bundle, tmp_path, run_cli, make, message):
    code, _, stderr = run_cli("run", bundle, "--source", make(tmp_path))
    assert code == 1 and message in stderr
    assert stderr.count("\n") == 1 and stderr.startswith("edgecap run: error:")


def _junk(path):
    path.write_bytes(b"\x89MCAP0\r\n" + b"\x00garbage" * 100)
    return path


def test_unknown_topic_is_one_line_and_exit_1(bundle, synth, run_cli):
    code, _, stderr = run_cli("run", bundle, "--source", synth / "video" / "tabletop.mcap",
                              "--topic", "/camera/depth")
    assert code == 1 and stderr.count("\n") == 1
    assert "no topic '/camera/depth'; image topics: /camera/image_raw (Image, 12 msgs)" in stderr


def test_sigterm_leaves_a_finished_caption_log(bundle, tmp_path, run_module_cli):
    code, _, stderr = run_module_cli("data", "synth", "--out", tmp_path / "long", "--images", 2,
                                     "--sequences", 0, "--video-frames", 300, "--size", 32,
                                     "--mcap", "--quiet")
    assert code == 0, stderr
    out = tmp_path / "term.mcap"
    jsonl = tmp_path / "term.jsonl"
    code, stdout, stderr = terminate_after_records(
        [sys.executable, "-m", "edgecap.cli", "run", bundle, "--source",
         tmp_path / "long" / "video" / "tabletop.mcap", "--replay", "realtime",
         "--out-mcap", out, "--jsonl", jsonl], jsonl, cwd=REPO)
    assert code == 0, stderr
    assert "stopped by signal" in stdout
    n = len(jsonl.read_text().splitlines())
    assert 3 <= n < 300
    assert len(_read(out)["/edgecap/caption"]) == n  # finished, indexed, readable
    assert hidden_leftovers(tmp_path) == []


@pytest.mark.parametrize("storage, options", [
    ("sqlite3", {"killed": True, "wal_tail": 2, "parts": 2}),      # resilient preset, kill -9
    ("mcap", {"preset": "zstd_fast", "parts": 2, "compression": "file"}),
])
def test_run_on_a_recording_as_ros2_bag_record_leaves_it(bundle, tmp_path, run_cli, storage,
                                                        options):
    """`edgecap run` on a Jazzy recording laid out as rosbag2 writes it (tests/rosbag2_like.py),
    with /rosout and camera_info beside the camera; the caption log, read back with rosbags,
    carries every image's log time and the records its header stamp."""
    from rosbag2_like import record
    from test_ros_rosbag2_layouts import STORE, camera_recording

    rec, shots = camera_recording("jazzy")
    bag = record(tmp_path / "run1", rec, STORE, storage, **options)
    out, jsonl = tmp_path / "captions.mcap", tmp_path / "captions.jsonl"
    code, stdout, stderr = run_cli("run", bundle, "--source", bag, "--topic", "/camera/image_raw",
                                   "--replay", "fast", "--out-mcap", out, "--jsonl", jsonl)
    assert code == 0, stderr
    assert f"summary: {len(shots)} frames captioned, 0 dropped" in stdout
    if options.get("killed"):
        assert "no metadata.yaml (recording stopped uncleanly?)" in stderr
        assert "read with the messages still in run1_1.db3-wal" in stderr
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["header_stamp_ns"] for r in records] == [s[0] for s in shots]
    captions = _read(out)["/edgecap/caption"]
    assert [t for t, _ in captions] == [s[1] for s in shots]
    assert [m.data for _, m in captions] == [r["caption"] for r in records]
