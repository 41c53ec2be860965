"""Robot logs in, caption logs out: logs written by rosbags' and mcap-ros2-support's own writers
(rosbag2 in SQLite3 and MCAP storage, bare .mcap; Image and CompressedImage), the loop run over
them, and the caption log read back with rosbags, not the library that wrote it.

The MCAP `ros2` profile's channel metadata on the logs edgecap writes (the caption log of
`edgecap run --out-mcap`, the camera log of `edgecap data synth --mcap`), checked with the
readers robot tooling uses: rosbags' rosbag2 MCAP storage reader (which parses
`offered_qos_profiles` into QoS objects), the mcap library, and rosbags' own rosbag2 MCAP
writer as the reference for the layout. Foxglove's view of the same metadata is in
test_ros_foxglove.py.
"""

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from runtime_helpers import FakeBundle, drain, hidden_leftovers, read_frames

pytest.importorskip("rosbags")
pytest.importorskip("mcap_ros2")

from rosbags.highlevel import AnyReader  # noqa: E402
from rosbags.rosbag2 import StoragePlugin, Writer  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402

from edgecap.errors import EdgecapError  # noqa: E402
from edgecap.io import terminate_as_interrupt  # noqa: E402
from edgecap.runtime.camera import FrameGrabber  # noqa: E402
from edgecap.runtime.captioner import Captioner  # noqa: E402
from edgecap.runtime.command import RunSettings, execute  # noqa: E402
from edgecap.runtime.sources import (  # noqa: E402
    KnownObject,
    LogSource,
    SourceOpenError,
    make_source,
)

STORE = get_typestore(Stores.LATEST)
T = STORE.types
IMAGE, COMPRESSED = "sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage"
START = 1_712_000_000_123_456_789
PERIOD = 50_000_000                      # 20 Hz
DELAY = 3_000_000                        # driver stamp -> recorder log time
COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30), (30, 200, 200)]


def frames(n=5):
    """(header stamp, log time, BGR image) of a 20 Hz camera; the dominant channel cycles."""
    out = []
    for i in range(n):
        image = np.zeros((24, 32, 3), np.uint8)
        image[:] = COLOURS[i % len(COLOURS)]
        image[4:10, 6:14] = 255
        out.append((START + i * PERIOD, START + i * PERIOD + DELAY, image))
    return out


def _header(stamp):
    sec, nsec = divmod(stamp, 1_000_000_000)
    return T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=sec, nanosec=nsec),
                                    frame_id="camera_optical")


def image_msg(stamp, image):
    rgb = np.ascontiguousarray(image[:, :, ::-1])
    return T[IMAGE](header=_header(stamp), height=rgb.shape[0], width=rgb.shape[1],
                    encoding="rgb8", is_bigendian=0, step=rgb.shape[1] * 3, data=rgb.reshape(-1))


def compressed_msg(stamp, image, data=None):
    import cv2

    if data is None:
        data = cv2.imencode(".png", image)[1].tobytes()
    return T[COMPRESSED](header=_header(stamp), format="png",
                         data=np.frombuffer(data, np.uint8))


def write_rosbag2(path, storage, topics):
    """topics: {name: (msgtype, [(log_time, message), ...])} with rosbags' rosbag2 Writer."""
    plugin = {"sqlite3": StoragePlugin.SQLITE3, "mcap": StoragePlugin.MCAP}[storage]
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        for name, (msgtype, messages) in topics.items():
            conn = writer.add_connection(name, msgtype, typestore=STORE)
            for log_time, msg in messages:
                writer.write(conn, log_time, STORE.serialize_cdr(msg, msgtype))
    return path


def write_mcap(path, topics, chunk_size=1024 * 1024):
    """A bare .mcap with mcap-ros2-support's own Writer (messages as dicts)."""
    from mcap_ros2.writer import Writer as McapWriter

    def as_dict(msg):
        if hasattr(msg, "__dataclass_fields__"):
            return {k: as_dict(getattr(msg, k)) for k in msg.__dataclass_fields__
                    if k != "__msgtype__"}
        if isinstance(msg, np.ndarray):
            return msg.tobytes()
        return msg

    with open(path, "wb") as fh:
        writer = McapWriter(fh, chunk_size=chunk_size)
        for name, (msgtype, messages) in topics.items():
            schema = writer.register_msgdef(msgtype, STORE.generate_msgdef(msgtype, ros_version=2)[0])
            for log_time, msg in messages:
                writer.write_message(name, schema, as_dict(msg), log_time=log_time)
        writer.finish()
    return path


def camera_topics(kind="image", n=5):
    make = image_msg if kind == "image" else compressed_msg
    return {"/camera/image_raw" if kind == "image" else "/camera/image/compressed":
            (IMAGE if kind == "image" else COMPRESSED,
             [(log, make(stamp, img)) for stamp, log, img in frames(n)])}



LOG_KINDS = [("sqlite3", "image"), ("sqlite3", "compressed"), ("mcap", "image"),
             ("mcap", "compressed"), ("bare", "image"), ("bare", "compressed")]


def make_log(tmp_path, storage, kind, n=5):
    if storage == "bare":
        return write_mcap(tmp_path / "run.mcap", camera_topics(kind, n))
    return write_rosbag2(tmp_path / f"bag_{storage}", storage, camera_topics(kind, n))


def run_on(log, **settings):
    """`edgecap run` with a fake one-row bundle over `log`, its console output dropped:
    -> (summary, error)."""
    return execute(Captioner(FakeBundle(batch_size=1, beam_size=1)), RunSettings(source=str(log), **settings),
                   out=io.StringIO())


@pytest.mark.parametrize("storage, kind", LOG_KINDS)
def test_log_source_reads_images_with_their_stamps(tmp_path, storage, kind):
    source = make_source(str(make_log(tmp_path, storage, kind)))
    assert isinstance(source, LogSource)
    source.open()
    try:
        good, bad = drain(source)
    finally:
        source.close()
    assert not bad
    expected = frames()
    assert [c.index for c in good] == list(range(5))
    for captured, (stamp, log_time, image) in zip(good, expected, strict=True):
        assert np.array_equal(captured.image, image)
        assert captured.stamp.header_ns == stamp and captured.stamp.log_ns == log_time
        assert captured.stamp.frame_id == "camera_optical"
    assert [round(c.due, 3) for c in good] == [0.0, 0.05, 0.1, 0.15, 0.2]
    assert source.fps == pytest.approx(20.0, rel=0.05)


def test_a_killed_recording_without_metadata_is_read_from_its_mcap_files(tmp_path):
    bag = make_log(tmp_path, "mcap", "image")
    (bag / "metadata.yaml").unlink()
    good, _, note = read_frames(bag)
    assert len(good) == 5 and "no metadata.yaml" in note


def _two_camera_log(tmp_path):
    topics = camera_topics("image")
    topics.update(camera_topics("compressed"))
    topics["/chatter"] = ("std_msgs/msg/String", [(START, T["std_msgs/msg/String"](data="hi"))])
    return write_mcap(tmp_path / "two.mcap", topics)


def test_several_image_topics_need_topic_and_the_error_lists_them(tmp_path):
    log = _two_camera_log(tmp_path)
    with pytest.raises(SourceOpenError) as err:
        make_source(str(log)).open()
    message = str(err.value)
    assert "2 image topics; choose one with --topic" in message and "\n" not in message
    assert "/camera/image_raw (Image, 5 msgs)" in message
    assert "/camera/image/compressed (CompressedImage, 5 msgs)" in message
    source = make_source(str(log), topic="/camera/image/compressed")
    source.open()
    assert len(drain(source)[0]) == 5
    source.close()


@pytest.mark.parametrize("topic, message", [
    ("/camera/depth", "no topic '/camera/depth'; image topics: /camera/image/compressed"),
    ("/chatter", "topic /chatter is std_msgs/msg/String, not sensor_msgs/msg/Image"),
])
def test_a_missing_topic_or_another_type_is_one_line(tmp_path, topic, message):
    with pytest.raises(SourceOpenError, match=message):
        make_source(str(_two_camera_log(tmp_path)), topic=topic).open()


def test_topic_on_a_non_log_source_is_refused():
    with pytest.raises(SourceOpenError, match="--topic applies to rosbag2"):
        make_source("synth://tabletop", topic="/camera/image_raw")


def test_a_truncated_mcap_is_read_up_to_the_cut(tmp_path):
    # Noise does not compress, and small chunks are what a cut loses: as in a long recording.
    rng = np.random.default_rng(1)
    shots = [(stamp, log_time, rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
             for stamp, log_time, _ in frames(40)]
    log = write_mcap(tmp_path / "run.mcap", {"/camera/image_raw": (
        IMAGE, [(log_time, image_msg(stamp, img)) for stamp, log_time, img in shots])},
        chunk_size=8 * 1024)
    data = log.read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(data[: len(data) * 6 // 10])
    good, bad, note = read_frames(cut)
    assert 0 < len(good) < 40 and not bad
    assert [c.stamp.header_ns for c in good] == [f[0] for f in frames(40)[: len(good)]]
    assert "recording cut short" in note and "mcap recover" in note


@pytest.mark.parametrize("name, content, message", [
    ("junk.mcap", b"this is not an mcap file at all" * 10, "not a readable MCAP file"),
    ("junk.db3", b"SQLite format 3\x00" + b"\x07" * 500, "cannot read"),
])
def test_a_corrupt_log_is_one_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(SourceOpenError, match=message) as err:
        make_source(str(tmp_path / name)).open()
    assert "\n" not in str(err.value) and name in str(err.value)


def test_a_sqlite_log_damaged_mid_way_ends_the_run_with_one_line(tmp_path):
    bag = make_log(tmp_path, "sqlite3", "image", n=30)
    db = next(bag.glob("*.db3"))
    with sqlite3.connect(db) as con:  # a page of message rows overwritten with garbage
        con.execute("PRAGMA journal_mode=DELETE")
    raw = bytearray(db.read_bytes())
    page = 4096
    for offset in range(page * 3, len(raw) - page, page * 2):
        raw[offset: offset + 64] = b"\xff" * 64
    db.write_bytes(bytes(raw))
    source = make_source(str(bag))
    try:
        source.open()
        drain(source)
    except (SourceOpenError, EdgecapError) as exc:
        assert "\n" not in str(exc) and str(bag) in str(exc)
    else:
        pytest.fail("a damaged SQLite log read without complaint")
    finally:
        source.close()


def test_a_compressed_image_that_does_not_decode_is_skipped_and_counted(tmp_path):
    msgs = [(log, compressed_msg(stamp, img)) for stamp, log, img in frames()]
    stamp, log, _ = frames()[2]
    msgs[2] = (log, compressed_msg(stamp, None, data=b"\x89PNG\r\n\x1a\n broken"))
    bag = write_rosbag2(tmp_path / "bag", "mcap", {"/cam": (COMPRESSED, msgs)})
    summary, error = run_on(bag, pace="every", quiet=True)
    assert error is None
    assert summary.captioned == 4 and summary.grabber.skipped == 1
    assert "message 2" in summary.grabber.last_skip and "does not decode" in summary.grabber.last_skip


def test_an_unknown_encoding_ends_the_run_with_one_line_naming_it(tmp_path):
    stamp, log, img = frames()[0]
    msg = image_msg(stamp, img)
    msg.encoding = "yuv420"
    bag = write_mcap(tmp_path / "yuv.mcap", {"/cam": (IMAGE, [(log, msg)])})
    summary, error = run_on(bag, pace="every", quiet=True)
    assert summary.captioned == 0
    assert "'yuv420' is not supported" in error and "/cam" in error and "\n" not in error


def test_realtime_replay_releases_frames_at_their_recorded_times(tmp_path):
    source = make_source(str(make_log(tmp_path, "bare", "image")))
    source.open()
    published = []
    grabber = FrameGrabber(source, pace="native",
                           on_publish=lambda f: published.append(f.t_capture))
    with grabber:
        while not grabber.finished:
            grabber.get(timeout=0.05)
    assert len(published) == 5
    # frame k is released 50 ms * k after the first, as recorded (never earlier)
    assert all(published[k] - published[0] >= 0.05 * k - 1e-3 for k in range(5))


def _read_caption_log(path):
    """topic -> [(log time, message)] with rosbags (the log was written by edgecap)."""
    out = {}
    with AnyReader([Path(path)]) as reader:
        for conn, log_time, raw in reader.messages():
            out.setdefault(conn.topic, []).append((log_time, reader.deserialize(raw, conn.msgtype),
                                                   conn.msgtype))
    return out


def _ns(stamp):
    return stamp.sec * 1_000_000_000 + stamp.nanosec


@pytest.mark.parametrize("storage, kind", [("sqlite3", "image"), ("bare", "compressed")])
def test_caption_log_is_stamped_like_the_images_and_readable_by_rosbags(tmp_path, storage, kind):
    log = make_log(tmp_path, storage, kind)
    out = tmp_path / "captions.mcap"
    detections = tmp_path / "det.jsonl"
    detections.write_text("\n".join(json.dumps(
        {"frame_id": i, "objects": [{"class": "cup", "box": [6, 4, 13, 9]},
                                    {"class": "bottle", "box": [20, 10, 30, 20]}]})
        for i in range(5)) + "\n")
    summary, error = execute(
        Captioner(FakeBundle(batch_size=1, beam_size=1)),
        RunSettings(source=str(log), replay="fast", pace="every", out_mcap=str(out),
                    detections=str(detections), coverage=False, quiet=True),
        out=io.StringIO())
    assert error is None and summary.captioned == 5
    topics = _read_caption_log(out)
    assert set(topics) == {"/edgecap/caption", "/edgecap/record", "/edgecap/annotations"}
    stamps = [f[0] for f in frames()]
    log_times = [f[1] for f in frames()]
    captions = topics["/edgecap/caption"]
    assert [t for t, _, _ in captions] == log_times           # logged when the image was
    assert {m for _, _, m in captions} == {"std_msgs/msg/String"}
    records = [json.loads(m.data) for _, m, _ in topics["/edgecap/record"]]
    assert [m.data for _, m, _ in captions] == [r["caption"] for r in records]
    assert all(m.data.endswith(" cup") for _, m, _ in captions)
    assert [r["header_stamp_ns"] for r in records] == stamps
    assert [r["log_time_ns"] for r in records] == log_times
    assert all("capture_to_caption_ms" in r and "latency_ms" in r for r in records)
    annotations = topics["/edgecap/annotations"]
    assert {m for _, _, m in annotations} == {"foxglove_msgs/msg/ImageAnnotations"}
    for (log_time, msg, _), stamp in zip(annotations, stamps, strict=True):
        assert log_time == log_times[stamps.index(stamp)]
        assert {_ns(p.timestamp) for p in msg.points} == {stamp}
        assert {_ns(t.timestamp) for t in msg.texts} == {stamp}
        cup = msg.points[0]
        assert cup.type == 2 and [(p.x, p.y) for p in cup.points] == [(6, 4), (14, 4), (14, 10),
                                                                        (6, 10)]
        texts = [t.text for t in msg.texts]
        assert texts[:2] == ["cup", "bottle"]
        assert texts[2:] == [records[stamps.index(stamp)]["caption"]]


def test_named_and_unnamed_objects_get_different_colours(tmp_path):
    from runtime_helpers import solid

    from edgecap.runtime.camera import Frame
    from edgecap.runtime.captioner import Caption
    from edgecap.runtime.mcap_sink import McapCaptionSink
    from edgecap.runtime.records import Record
    from edgecap.runtime.sources import LogStamp

    frame = Frame(solid((0, 0, 200), 32), 0, 1.0, 2.0,
                  [KnownObject("cup", (1, 1, 10, 10), 0.1), KnownObject("bottle", (12, 12, 20, 20), 0.1)],
                  stamp=LogStamp(START, START + DELAY, "cam"))
    record = Record(frame, Caption("a cup on a table", [4, 8], beam=1), "test", 1.1)
    record.matches = [{"noun": "cup", "class": "cup", "profit": 1.0, "exact": True}]
    sink = McapCaptionSink(tmp_path / "c.mcap")
    sink.write(record)
    sink.close()
    msg = _read_caption_log(tmp_path / "c.mcap")["/edgecap/annotations"][0][1]
    named, unnamed = msg.points
    assert named.outline_color.g > 0.7 and named.thickness > unnamed.thickness
    assert (unnamed.outline_color.r, unnamed.outline_color.g) != (named.outline_color.r,
                                                                  named.outline_color.g)
    assert [t.text for t in msg.texts][-1] == "a cup on a table"


def test_caption_log_refuses_to_overwrite_a_file_it_did_not_write(tmp_path):
    log = make_log(tmp_path, "bare", "image")
    theirs = tmp_path / "theirs.mcap"
    theirs.write_bytes(b"precious")
    with pytest.raises(EdgecapError, match="not an MCAP log written by edgecap"):
        run_on(log, out_mcap=str(theirs))
    assert theirs.read_bytes() == b"precious"
    with pytest.raises(EdgecapError, match="is the input log"):
        run_on(log, out_mcap=str(log))
    # A log edgecap wrote is replaced by the next run.
    ours = tmp_path / "ours.mcap"
    for frames_wanted in (5, 2):
        summary, _ = run_on(log, pace="every", frames=frames_wanted, out_mcap=str(ours), quiet=True)
        assert len(_read_caption_log(ours)["/edgecap/caption"]) == frames_wanted


def test_unwritable_caption_log_fails_before_captioning(tmp_path):
    log = make_log(tmp_path, "bare", "image")
    blocker = tmp_path / "notes.txt"         # a file where the log's folder would have to be
    blocker.write_text("keep me")
    bundle = FakeBundle(batch_size=1, beam_size=1)
    with pytest.raises(EdgecapError, match="notes.txt is a file, not a directory"):
        execute(Captioner(bundle), RunSettings(source=str(log), out_mcap=str(blocker / "c.mcap")),
                out=io.StringIO())
    assert bundle.seen_batches == [] and blocker.read_text() == "keep me"


def test_sigterm_mid_run_leaves_a_finished_readable_caption_log(tmp_path):
    log = make_log(tmp_path, "bare", "image", n=200)
    out = tmp_path / "stopped.mcap"
    bundle = FakeBundle(batch_size=1, beam_size=1, delay=0.01)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
    with terminate_as_interrupt():  # as the CLI runs every command
        timer.start()
        summary, error = execute(Captioner(bundle), RunSettings(source=str(log), out_mcap=str(out),
                                                                quiet=True), out=io.StringIO())
        timer.join()
    assert error is None and summary.stopped_by == "signal" and 0 < summary.captioned < 200
    assert len(_read_caption_log(out)["/edgecap/caption"]) == summary.captioned
    assert hidden_leftovers(tmp_path) == []


# Writes one message to the caption log argv[1], says "ready" and waits to be killed.
_KILLED_WRITER = """
import sys
from edgecap.ros.mcap_out import McapLogWriter
writer = McapLogWriter(sys.argv[1])
writer.write("/t", "std_msgs/msg/String", {"data": "lost"}, 1)
print("ready", flush=True)
sys.stdin.read()
"""


def test_caption_log_writers_never_share_or_strand_a_temporary(tmp_path, capsys):
    from edgecap.ros.mcap_out import McapLogWriter

    out = tmp_path / "c.mcap"
    # One writer per log: a second writer of the same log is refused in one line and leaves
    # nothing; the first finishes its file.
    first = McapLogWriter(out)
    first.write("/t", "std_msgs/msg/String", {"data": "first"}, 1)
    with pytest.raises(EdgecapError, match=r"c\.mcap is being written by another process \(pid \d+"):
        McapLogWriter(out)
    first.close()
    assert [m.data for _, m, _ in _read_caption_log(out)["/t"]] == ["first"]
    assert hidden_leftovers(tmp_path) == []
    # A writer killed where nothing can clean up: the next write of the log removes what it left.
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait()
    assert len(hidden_leftovers(tmp_path)) == 1
    McapLogWriter(out).close()
    assert hidden_leftovers(tmp_path) == [] and _read_caption_log(out) == {}
    assert "left by an interrupted write of c.mcap" in capsys.readouterr().err


def test_a_caption_log_that_cannot_be_finished_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """A disk that fills up while the summary and footer are written: no half log under the
    name, no work directory, the earlier log of that name kept (edgecap.io.RunOutput)."""
    from edgecap.ros.mcap_out import McapLogWriter

    out = tmp_path / "c.mcap"
    McapLogWriter(out).close()
    before = out.read_bytes()
    writer = McapLogWriter(out)
    writer.write("/t", "std_msgs/msg/String", {"data": "lost"}, 1)

    def full_disk():
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer._writer, "finish", full_disk)
    with pytest.raises(EdgecapError) as err:
        writer.close()
    assert str(err.value) == f"--out-mcap {out}: cannot finish the log (No space left on device)"
    assert out.read_bytes() == before and hidden_leftovers(tmp_path) == []
    writer.close()  # closing again does nothing


def test_rerun_recording_has_the_images_boxes_and_captions_at_their_log_times(tmp_path):
    pytest.importorskip("rerun")
    import pyarrow as pa
    from rerun.chunk import RrdReader

    log = make_log(tmp_path, "bare", "image")
    detections = tmp_path / "det.jsonl"
    detections.write_text("\n".join(json.dumps({"frame_id": i, "objects": [
        {"class": "cup", "box": [6, 4, 13, 9]}]}) for i in range(5)) + "\n")
    out = tmp_path / "run.rrd"
    summary, error = run_on(log, pace="every", rerun=str(out), detections=str(detections), coverage=False, quiet=True)
    assert error is None and summary.captioned == 5
    rows = {}
    for chunk in RrdReader(out).stream():
        batch = chunk.to_record_batch()
        if "image_log_time" in batch.schema.names:
            times = batch.column("image_log_time").cast(pa.int64()).to_pylist()
            rows.setdefault(chunk.entity_path, []).extend(times)
            if chunk.entity_path == "/caption":
                texts = batch.column("TextLog:text").to_pylist()
            if chunk.entity_path == "/camera/image/objects":
                labels = batch.column("Boxes2D:labels").to_pylist()
    log_times = [f[1] for f in frames()]
    for entity in ("/camera/image", "/camera/image/objects", "/caption",
                   "/latency/capture_to_caption_ms"):
        assert sorted(rows[entity]) == log_times, entity
    assert all(t[0].endswith(" cup") for t in texts) and labels[0] == ["cup"]
    # A second run replaces the recording it wrote; a file it did not write is refused.
    theirs = tmp_path / "theirs.rrd"
    theirs.write_bytes(b"not ours")
    with pytest.raises(EdgecapError, match="not a rerun recording written by edgecap"):
        run_on(log, rerun=str(theirs))
    assert theirs.read_bytes() == b"not ours"
    run_on(log, pace="every", frames=2, rerun=str(out), quiet=True)
    assert hidden_leftovers(tmp_path) == []


_WITHOUT = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None          # as if the package were not installed
from edgecap.errors import EdgecapError
from edgecap.runtime.sources import make_source
try:
    make_source({log!r}).open()
except EdgecapError as exc:
    print(exc)
"""


@pytest.mark.parametrize("blocked, log_name", [(["mcap", "mcap_ros2"], "run.mcap"),
                                               (["rosbags"], "bag_sqlite3")])
def test_without_the_ros_extra_a_log_source_names_it(tmp_path, blocked, log_name):
    import subprocess
    import sys

    log = make_log(tmp_path, "bare" if log_name.endswith(".mcap") else "sqlite3", "image")
    code = _WITHOUT.format(blocked=blocked, log=str(log))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1].endswith('pip install "edgecap[ros]"')
    assert res.stdout.count("\n") == 1


def test_an_mcap_converted_from_a_ros1_bag_is_read(tmp_path):
    """`mcap convert run.bag run.mcap` keeps ROS 1's spelling and serialisation: profile `ros1`,
    schemas `sensor_msgs/Image` in `ros1msg`, messages in `ros1` encoding with a `seq` in their
    headers. Written here with mcap's own Writer and rosbags' ROS 1 serialiser."""
    from mcap.writer import Writer as RawWriter
    from rosbags.typesys import Stores, get_typestore

    ros1 = get_typestore(Stores.ROS1_NOETIC)
    path = tmp_path / "converted.mcap"
    with open(path, "wb") as fh:
        writer = RawWriter(fh)
        writer.start(profile="ros1", library="mcap convert")
        schema = writer.register_schema("sensor_msgs/Image", "ros1msg",
                                        ros1.generate_msgdef(IMAGE, ros_version=1)[0].encode())
        channel = writer.register_channel("/camera/image_raw", "ros1", schema)
        for seq, (stamp, log_time, image) in enumerate(frames()):
            sec, nsec = divmod(stamp, 1_000_000_000)
            rgb = np.ascontiguousarray(image[:, :, ::-1])
            header = ros1.types["std_msgs/msg/Header"](
                seq=seq, stamp=ros1.types["builtin_interfaces/msg/Time"](sec=sec, nanosec=nsec),
                frame_id="camera_optical")
            msg = ros1.types[IMAGE](header=header, height=rgb.shape[0], width=rgb.shape[1], encoding="rgb8",
                                    is_bigendian=0, step=rgb.shape[1] * 3, data=rgb.reshape(-1))
            writer.add_message(channel, log_time=log_time, publish_time=log_time,
                               data=bytes(ros1.serialize_ros1(msg, IMAGE)), sequence=seq)
        writer.finish()

    good, bad, _ = read_frames(path)
    assert not bad
    assert len(good) == 5
    for captured, (stamp, log_time, image) in zip(good, frames(), strict=True):
        assert np.array_equal(captured.image, image)
        assert captured.stamp.header_ns == stamp and captured.stamp.log_ns == log_time


# -- the MCAP ros2 profile's channel metadata on the logs edgecap writes ---------------------------
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
