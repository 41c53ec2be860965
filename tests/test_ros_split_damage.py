"""A split rosbag2 recording (run_0, run_1, ...) whose file before the last is damaged: cut short,
or compressed per file (`--compression-mode file`) and cut short. The frames before the damage
are captioned; then the run ends with one line naming the damaged file. A cut MCAP is the
exception: it is read up to the cut, as a cut last file is, and the recording goes on. The logs are written with rosbags'
own rosbag2 Writer, one bag per split file, assembled as `ros2 bag record --max-bag-size` lays
them out."""

import shutil

import pytest
from runtime_helpers import FakeBundle, read_frames

pytest.importorskip("rosbags")
pytest.importorskip("mcap_ros2")

from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer  # noqa: E402
from test_ros_logs import IMAGE, STORE, frames, image_msg  # noqa: E402

from edgecap.errors import EdgecapError  # noqa: E402
from edgecap.runtime.sources import make_source  # noqa: E402

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
