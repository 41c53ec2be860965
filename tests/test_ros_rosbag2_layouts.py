"""Robot logs as `ros2 bag record` writes them on Humble, Iron and Jazzy (tests/rosbag2_like.py
builds them from rosbag2's own table schemas, writer options and metadata layout, without
edgecap's writer): every storage, preset, split and compression mode reads every frame with its
stamps, and so do the recordings a robot leaves behind when it is killed or loses power.
Also: the caption log has what Foxglove and `ros2 bag` need, read with mcap's own reader.

A split rosbag2 recording (run_0, run_1, ...) whose file before the last is damaged: cut short,
or compressed per file (`--compression-mode file`) and cut short. The frames before the damage
are captioned; then the run ends with one line naming the damaged file. A cut MCAP is the
exception: it is read up to the cut, as a cut last file is, and the recording goes on. The logs are written with rosbags'
own rosbag2 Writer, one bag per split file, assembled as `ros2 bag record --max-bag-size` lays
them out.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest
from rosbag2_like import Recording, Topic, qos_string, record
from runtime_helpers import FakeBundle, read_frames

pytest.importorskip("rosbags")
pytest.importorskip("mcap_ros2")

from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer  # noqa: E402
from test_ros_logs import (  # noqa: E402
    COMPRESSED,
    IMAGE,
    STORE,
    T,
    compressed_msg,
    frames,
    image_msg,
)

from edgecap.errors import EdgecapError  # noqa: E402
from edgecap.runtime.sources import SourceOpenError, make_source  # noqa: E402

N = 6


def camera_recording(distro="jazzy", kind="image"):
    """The camera topic plus what `ros2 bag record -a` also catches (/rosout, camera_info)."""
    make, msgtype, name = ((image_msg, IMAGE, "/camera/image_raw") if kind == "image" else
                           (compressed_msg, COMPRESSED, "/camera/image_raw/compressed"))
    shots = frames(N)
    log = T["rcl_interfaces/msg/Log"](stamp=T["builtin_interfaces/msg/Time"](sec=1, nanosec=0),
                                      level=20, name="camera", msg="started", file="cam.cpp",
                                      function="main", line=7)
    info = T["sensor_msgs/msg/CameraInfo"]
    topics = [
        Topic(name, msgtype, [(lt, bytes(STORE.serialize_cdr(make(st, im), msgtype)))
                              for st, lt, im in shots]),
        Topic("/rosout", "rcl_interfaces/msg/Log",
              [(shots[0][1] - 1, bytes(STORE.serialize_cdr(log, "rcl_interfaces/msg/Log")))]),
        Topic("/camera/camera_info", "sensor_msgs/msg/CameraInfo", [
            (lt + 1, bytes(STORE.serialize_cdr(info(
                header=image_msg(st, im).header, height=24, width=32, distortion_model="plumb_bob",
                d=np.zeros(5), k=np.eye(3).reshape(-1), r=np.eye(3).reshape(-1),
                p=np.zeros(12), binning_x=0, binning_y=0,
                roi=T["sensor_msgs/msg/RegionOfInterest"](x_offset=0, y_offset=0, height=0,
                                                          width=0, do_rectify=False)),
                "sensor_msgs/msg/CameraInfo"))) for st, lt, im in shots]),
    ]
    return Recording(topics, distro), shots


def assert_every_frame(good, bad, shots):
    assert not bad
    assert [c.stamp.header_ns for c in good] == [s[0] for s in shots]
    assert [c.stamp.log_ns for c in good] == [s[1] for s in shots]
    assert all(np.array_equal(c.image, s[2]) for c, s in zip(good, shots, strict=True))


LAYOUTS = [
    ("humble", "sqlite3", {}), ("iron", "sqlite3", {}), ("jazzy", "sqlite3", {}),
    ("humble", "mcap", {}), ("iron", "mcap", {}), ("jazzy", "mcap", {}),
    ("jazzy", "mcap", {"preset": "zstd_fast"}), ("jazzy", "mcap", {"preset": "zstd_small"}),
    ("jazzy", "mcap", {"preset": "fastwrite"}), ("jazzy", "mcap", {"preset": "lz4"}),
    ("jazzy", "mcap", {"parts": 3, "preset": "zstd_fast"}), ("humble", "sqlite3", {"parts": 3}),
    ("jazzy", "mcap", {"compression": "file", "parts": 2}),
    ("humble", "sqlite3", {"compression": "file"}), ("jazzy", "sqlite3", {"compression": "file"}),
    ("humble", "sqlite3", {"compression": "message", "parts": 2}),
]


@pytest.mark.parametrize("distro, storage, options", LAYOUTS,
                         ids=[f"{d}-{s}-{'-'.join(f'{k}={v}' for k, v in o.items())}"
                              for d, s, o in LAYOUTS])
@pytest.mark.parametrize("kind", ["image", "compressed"])
def test_every_rosbag2_layout_reads_every_frame_with_its_stamps(tmp_path, distro, storage,
                                                                 options, kind):
    rec, shots = camera_recording(distro, kind)
    bag = record(tmp_path / "run1", rec, STORE, storage, **options)
    good, bad, note = read_frames(bag, topic=rec.topics[0].name)
    assert_every_frame(good, bad, shots)
    assert note is None
    assert [p.name for p in tmp_path.rglob("*")] == [p.name for p in bag.parent.rglob("*")]


def test_metadata_whose_qos_differs_from_the_database_still_pairs_topics_by_name(tmp_path):
    # rosbag2's own test bags (rosbag2_py/test/resources/sqlite3/talker) hold Foxy's "infinite"
    # durations in the database and zeros in metadata.yaml; rosbag2 pairs topics by name.
    rec, shots = camera_recording("humble")
    bag = record(tmp_path / "run1", rec, STORE, "sqlite3")
    metadata = bag / "metadata.yaml"
    text = metadata.read_text()
    assert text.count("9223372036") == 3 * len(rec.topics)   # deadline, lifespan, lease
    assert "9223372036" in qos_string(5)
    metadata.write_text(text.replace("9223372036", "0").replace("854775807", "0"))
    good, bad, _ = read_frames(bag)
    assert_every_frame(good, bad, shots)


@pytest.mark.parametrize("storage, options", [
    ("sqlite3", {}), ("sqlite3", {"parts": 2, "compression": "message"}),
    ("mcap", {"parts": 3, "compression": "file"}), ("mcap", {"preset": "fastwrite"})])
def test_a_killed_recording_without_metadata_reads_its_storage_files(tmp_path, storage, options):
    """A recorder killed (power loss, `kill -9`) never writes metadata.yaml. File compression
    had packed every finished split but the last, and was packing the one before it: its
    <file>.zstd is half-written while <file> is still whole. `fastwrite` writes no chunks, so
    a killed MCAP file holds every message up to the kill."""
    rec, shots = camera_recording("jazzy")
    killed_mcap = storage == "mcap" and "compression" in options
    bag = record(tmp_path / "run1", rec, STORE, storage, killed=not killed_mcap, **options)
    if killed_mcap:  # killed while packing run1_1.mcap, after the last split was closed
        (bag / "metadata.yaml").unlink()
        packed = bag / "run1_1.mcap.zstd"
        import zstandard

        whole = zstandard.ZstdDecompressor().decompress(packed.read_bytes())
        (bag / "run1_1.mcap").write_bytes(whole)
        packed.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    good, bad, note = read_frames(bag)
    assert_every_frame(good, bad, shots)
    assert "has no metadata.yaml (recording stopped uncleanly?)" in note


def test_a_resilient_recording_killed_before_sqlite_checkpointed_keeps_its_last_frames(tmp_path):
    """`ros2 bag record --storage-preset-profile resilient` writes through SQLite's WAL; killed,
    the newest messages are only in <file>.db3-wal. They are read, and nothing of the user's
    changes: the database and its log stay byte for byte, no file appears beside them."""
    rec, shots = camera_recording("jazzy")
    bag = record(tmp_path / "run1", rec, STORE, "sqlite3", killed=True, wal_tail=4)
    before = {p.name: p.read_bytes() for p in bag.iterdir()}
    assert {n.rsplit(".", 1)[-1] for n in before} == {"db3", "db3-wal", "db3-shm"}
    good, bad, note = read_frames(bag)
    assert_every_frame(good, bad, shots)
    assert "read with the messages still in run1_0.db3-wal" in note
    assert {p.name: p.read_bytes() for p in bag.iterdir()} == before
    from edgecap.ros.logs import open_log

    log = open_log(bag)                      # the checkpointed copy goes when the log closes
    copy = Path(log.scratch.name)
    assert (copy / "run1_0.db3").is_file()
    log.close()
    assert not copy.exists()


def test_a_split_recording_killed_before_its_last_file_got_a_chunk_reads_the_earlier_files(
        tmp_path):
    # rosbag2's MCAP writer puts schemas and channels into chunks, so a file cut before its
    # first chunk was flushed holds the header only.
    rec, shots = camera_recording("jazzy")
    bag = record(tmp_path / "run1", rec, STORE, "mcap", parts=2, killed=True)
    good, bad, note = read_frames(bag)
    assert not bad and 0 < len(good) < N
    assert [c.stamp.header_ns for c in good] == [s[0] for s in shots[: len(good)]]
    assert "run1_1.mcap: no index (recording cut short?)" in note
    with pytest.raises(SourceOpenError, match="cut short before any message") as err:
        make_source(str(bag / "run1_1.mcap")).open()
    assert "\n" not in str(err.value)


def test_an_image_topic_recorded_without_its_definition_is_read_with_the_builtin_one(tmp_path):
    """rosbag2 writes an empty schema (encoding `unknown`) when the recording machine has no
    .msg file for a type; the image types' fields are fixed, so the frames still decode."""
    rec, shots = camera_recording("jazzy")
    bag = record(tmp_path / "run1", rec, STORE, "mcap", definitions=False)
    good, bad, _ = read_frames(bag)
    assert_every_frame(good, bad, shots)


def test_caption_log_has_what_foxglove_and_ros2_bag_need(tmp_path):
    """Read with the mcap library's own reader (the log is written through mcap-ros2-support):
    profile ros2, ros2msg schemas named as rosbag2 names types, CDR channels, statistics per
    channel (what `ros2 bag info` and `play` read), and annotations decoded from the embedded
    definitions (tests/test_ros_logs.py reads the same kind of log with rosbags)."""
    import io
    import json

    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory
    from runtime_helpers import FakeBundle

    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.command import RunSettings, execute

    rec, shots = camera_recording("jazzy")
    bag = record(tmp_path / "run1", rec, STORE, "mcap", preset="zstd_fast")
    detections = tmp_path / "det.jsonl"
    detections.write_text("".join(json.dumps({"frame_id": i, "objects": [
        {"class": "cup", "box": [6, 4, 13, 9]}]}) + "\n" for i in range(N)))
    out = tmp_path / "captions.mcap"
    summary, error = execute(Captioner(FakeBundle(batch_size=1, beam_size=1)),
                             RunSettings(source=str(bag), topic="/camera/image_raw",
                                         replay="fast", out_mcap=str(out),
                                         detections=str(detections), coverage=False, quiet=True),
                             out=io.StringIO())
    assert error is None and summary.captioned == N
    with out.open("rb") as fh:
        reader = make_reader(fh, decoder_factories=[DecoderFactory()])
        assert reader.get_header().profile == "ros2"
        summary = reader.get_summary()
        schemas = {s.name: s.encoding for s in summary.schemas.values()}
        assert schemas == {"std_msgs/msg/String": "ros2msg",
                           "foxglove_msgs/msg/ImageAnnotations": "ros2msg"}
        assert {c.message_encoding for c in summary.channels.values()} == {"cdr"}
        counts = {summary.channels[i].topic: n
                  for i, n in summary.statistics.channel_message_counts.items()}
        assert counts == {"/edgecap/caption": N, "/edgecap/record": N, "/edgecap/annotations": N}
        annotations = [(m.log_time, d) for _, _, m, d in
                       reader.iter_decoded_messages(topics=["/edgecap/annotations"])]
    assert [t for t, _ in annotations] == [s[1] for s in shots]
    for (_, msg), shot in zip(annotations, shots, strict=True):
        stamp = msg.points[0].timestamp
        assert stamp.sec * 1_000_000_000 + stamp.nanosec == shot[0]
        assert msg.points[0].type == 2 and len(msg.points[0].points) == 4
        assert msg.texts[0].text == "cup" and msg.circles == []


def test_a_file_compressed_recording_is_unpacked_outside_the_users_directory(tmp_path):
    """Reading a file-compressed recording unpacks into a temporary directory, never beside
    the user's files, and removes it when the log is closed."""
    import tempfile

    from edgecap.ros.logs import open_log

    rec, _ = camera_recording("jazzy")
    bag = record(tmp_path / "run1", rec, STORE, "mcap", compression="file")
    listing = sorted(p.name for p in bag.iterdir())

    log = open_log(bag)
    scratch = Path(log.scratch.name)
    assert scratch.parent == Path(tempfile.gettempdir()) and any(scratch.iterdir())
    log.close()
    assert not scratch.exists() and sorted(p.name for p in bag.iterdir()) == listing


def test_a_compressed_file_cut_short_is_named_as_the_user_has_it(tmp_path):
    """Errors and notes name the user's <file>.zstd, never the temporary copy it was
    unpacked to; the split before it is read first (the damaged splits below)."""
    rec, _ = camera_recording("jazzy")
    bag = record(tmp_path / "run1", rec, STORE, "mcap", parts=2, compression="file")
    packed = bag / "run1_1.mcap.zstd"
    packed.write_bytes(packed.read_bytes()[: packed.stat().st_size * 6 // 10])
    with pytest.raises(EdgecapError) as err:
        read_frames(bag)
    message = str(err.value)
    assert message.startswith(f"log {packed}: the compressed file ends before any of its content")
    assert "\n" not in message and "edgecap-log-" not in message


def test_an_image_topic_that_recorded_nothing_is_listed_with_zero_messages(tmp_path):
    # `ros2 bag record -a` creates a channel for every advertised topic, published or not.
    rec, _ = camera_recording("jazzy")
    rec.topics.append(Topic("/camera/depth/image_rect_raw", IMAGE, []))
    bag = record(tmp_path / "run1", rec, STORE, "mcap")
    with pytest.raises(SourceOpenError) as err:
        make_source(str(bag)).open()
    assert "/camera/depth/image_rect_raw (Image, 0 msgs)" in str(err.value)
    assert f"/camera/image_raw (Image, {N} msgs)" in str(err.value)


# -- a split recording whose file before the last is damaged ---------------------------------------
PARTS, PER_PART = 3, 10


def split_recording(root, storage, compressed=False):
    """run/ with run_0..run_2 (.mcap | .db3, + .zstd when compressed) and metadata.yaml listing
    them; each file written by rosbags' Writer, 10 frames each."""
    from ruamel.yaml import YAML

    bag = root / "run"
    bag.mkdir(parents=True)
    shots = frames(PARTS * PER_PART)
    names, meta = [], None
    for k in range(PARTS):
        part = root / f"part{k}"
        writer = Writer(part, version=9,
                        storage_plugin={"sqlite3": StoragePlugin.SQLITE3, "mcap": StoragePlugin.MCAP}[storage])
        if compressed:
            writer.set_compression(CompressionMode.FILE, CompressionFormat.ZSTD)
        with writer:
            conn = writer.add_connection("/camera/image_raw", IMAGE, typestore=STORE)
            for stamp, log_time, image in shots[k * PER_PART:(k + 1) * PER_PART]:
                writer.write(conn, log_time, STORE.serialize_cdr(image_msg(stamp, image), IMAGE))
        info = YAML(typ="safe").load((part / "metadata.yaml").read_text())
        (written,) = info["rosbag2_bagfile_information"]["relative_file_paths"]
        name = written.replace(f"part{k}", f"run_{k}")
        shutil.move(part / written, bag / name)
        names.append(name)
        meta = meta or info
    meta["rosbag2_bagfile_information"]["relative_file_paths"] = names
    with (bag / "metadata.yaml").open("w") as fh:
        YAML().dump(meta, fh)
    return bag, names


def _cut(path, keep=0.6):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _read_until_error(bag):
    """(frames read, the error that ended the source or None)."""
    got = []
    source = make_source(str(bag))
    try:
        source.open()
        while True:
            try:
                got.append(source.read())
            except EdgecapError as exc:
                return got, exc
            except Exception as exc:  # EndOfStream and the like
                if type(exc).__name__ == "EndOfStream":
                    return got, None
                raise
    finally:
        source.close()


@pytest.mark.parametrize("storage, compressed", [
    ("sqlite3", False), ("sqlite3", True), ("mcap", True)])
def test_a_middle_split_that_cannot_be_opened_ends_the_log_after_the_frames_before_it(tmp_path, storage, compressed):
    """A .db3 cut short is no database; a cut .zstd of one small file decompresses to nothing."""
    bag, names = split_recording(tmp_path, storage, compressed)
    _cut(bag / names[1])
    got, error = _read_until_error(bag)
    assert [c.stamp.header_ns for c in got] == [f[0] for f in frames(PER_PART)]
    assert error is not None and "\n" not in str(error)
    assert names[1] in str(error) and f"the log was read up to it ({PER_PART} messages on /camera/image_raw)" in str(error)


def test_a_cut_middle_mcap_is_read_up_to_the_cut_as_a_cut_last_one_is(tmp_path):
    bag, names = split_recording(tmp_path, "mcap")
    _cut(bag / names[1])
    good, bad, note = read_frames(bag)
    assert not bad and "run_1.mcap: no index (recording cut short?)" in note
    stamps = [c.stamp.header_ns for c in good]
    assert stamps[:PER_PART] == [f[0] for f in frames(PER_PART)] and stamps == sorted(stamps)
    assert stamps[-PER_PART:] == [f[0] for f in frames(PARTS * PER_PART)[-PER_PART:]]  # the recording goes on


def test_a_damaged_first_split_is_one_line_at_open(tmp_path):
    bag, names = split_recording(tmp_path, "sqlite3")
    _cut(bag / names[0])
    source = make_source(str(bag))
    with pytest.raises(EdgecapError) as err:
        source.open()
    source.close()
    assert "\n" not in str(err.value) and names[0] in str(err.value)


def test_the_run_captions_the_frames_before_a_damaged_split_and_ends_with_one_line(tmp_path):
    import io

    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.command import RunSettings, execute

    bag, names = split_recording(tmp_path, "sqlite3", compressed=True)
    _cut(bag / names[1])
    jsonl = tmp_path / "c.jsonl"
    settings = RunSettings(source=str(bag), jsonl=str(jsonl), replay="fast", coverage=False)
    summary, error = execute(Captioner(FakeBundle()), settings, out=io.StringIO())
    assert summary.captioned == PER_PART and len(jsonl.read_text().splitlines()) == PER_PART
    assert error is not None and names[1] in error and "\n" not in error
