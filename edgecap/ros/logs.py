"""Reading robot logs: rosbag2 directories (SQLite3 or MCAP storage), .mcap, .db3 and .bag files.

Three readers, chosen by storage (benchmarks/log_read.py measured them; docs/runtime.md has
the numbers); this module finds a log's files and picks one, `reader.py` holds what they share:

    McapLog     mcap_log.py: mcap + mcap-ros2-support, for .mcap files and rosbag2 directories
                in MCAP storage. 1.0-1.7x faster than rosbags on image topics, and it reads a
                recording that was cut short (no summary or footer) up to the cut, which
                rosbags refuses.
    SqliteLog   rosbags_log.py: rosbags' storage reader, for rosbag2's SQLite3 files (.db3),
                each read by its own topics table, images deserialised with rosbags' ROS 2
                type store.
    RosbagsLog  rosbags_log.py: rosbags' AnyReader, for ROS 1 .bag files.

A rosbag2 directory is opened from the files its metadata.yaml lists (or, for a recording
killed before it wrote one, the storage files it holds), not through a reader that matches
the file's topics against metadata.yaml: rosbag2 itself pairs them by name, and a bag whose
metadata QoS differs from its database's (bags from before Humble, `ros2 bag reindex`) would
otherwise read as empty. Files compressed with `--compression-mode file` are unpacked into a
temporary directory first; messages compressed with `--compression-mode message` are recognised
by the zstd frame magic (a CDR payload never starts with it), also when metadata.yaml is gone.

Every reader hands out `(log_time_ns, message)` for one topic in log-time order, messages with
their fields as attributes; a message that does not deserialize comes out as `None` (skipped by
the source, not fatal). A log that cannot be opened, or breaks while being read, raises
LogError: one line naming the file. A split file after the first that cannot be opened ends
the log before it: the files before it are read, then that LogError (RobotLog.broken).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from edgecap.errors import require

from .images import IMAGE_TYPES
from .mcap_log import McapLog
from .reader import LogError, RobotLog, Topic
from .rosbags_log import RosbagsLog, SqliteLog

FILE_SUFFIXES = (".mcap", ".db3", ".bag")
STORAGE_SUFFIXES = {".mcap": "mcap", ".db3": "sqlite3"}


def is_log(path: Path) -> bool:
    """A file or directory `open_log` reads (decided by name, not by content)."""
    if path.is_file():
        return path.suffix.lower() in FILE_SUFFIXES
    if path.is_dir():
        return (path / "metadata.yaml").is_file() or bool(_storage_files(path))
    return False


def open_log(path: str | Path) -> RobotLog:
    path = Path(path)
    if not path.exists():
        raise LogError(f"log {path}: no such file or directory")
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".bag":
            return RosbagsLog(path)
        if suffix in STORAGE_SUFFIXES:
            return _open_storage(path, STORAGE_SUFFIXES[suffix], [path], "")
        raise LogError(f"log {path}: unknown log type {path.suffix!r}; expected a rosbag2 "
                       f"directory or a {', '.join(FILE_SUFFIXES)} file")
    metadata = path / "metadata.yaml"
    if metadata.is_file():
        storage, files, compression = _rosbag2_metadata(metadata)
        return _open_storage(path, storage, [path / Path(f).name for f in files], compression)
    # `ros2 bag record` writes metadata.yaml when it stops; a killed recording has none.
    files = _storage_files(path)
    storages = sorted({_storage_of(f) for f in files})
    if not files:
        raise LogError(f"log {path}: no metadata.yaml and no .mcap or .db3 files; not a "
                       "rosbag2 directory")
    if len(storages) > 1:
        raise LogError(f"log {path}: no metadata.yaml, and it holds both .mcap and .db3 files; "
                       "open one of them")
    compression = "file" if any(f.suffix == ".zstd" for f in files) else ""
    log = _open_storage(path, storages[0], files, compression)
    log.note = "; ".join(filter(None, [
        f"{path} has no metadata.yaml (recording stopped uncleanly?); read its "
        f"{len(files)} .{'mcap' if storages[0] == 'mcap' else 'db3'} file(s)", log.note]))
    return log


def _storage_of(file: Path) -> str:
    name = file.name.lower().removesuffix(".zstd")
    return STORAGE_SUFFIXES[Path(name).suffix]


def _storage_files(directory: Path) -> list[Path]:
    """A rosbag2 directory's storage files (also file-compressed ones) in recording order.
    rosbag2 compresses a finished split into <file>.zstd and then deletes <file>: when both
    are there the recorder was killed mid-compression, and <file> is the whole one."""
    files = [p for p in directory.iterdir() if p.is_file()
             and Path(p.name.lower().removesuffix(".zstd")).suffix in STORAGE_SUFFIXES]
    names = {p.name for p in files}
    files = [p for p in files if not (p.suffix == ".zstd" and p.stem in names)]
    return sorted(files, key=_split_order)


def _split_order(path: Path):
    """run_0.mcap, run_1.mcap, ..., run_10.mcap in recording order."""
    stem = Path(path.name.removesuffix(".zstd")).stem
    m = re.search(r"_(\d+)$", stem)
    return (stem[: m.start()] if m else stem, int(m.group(1)) if m else -1)


def _open_storage(path: Path, storage: str, files: list[Path], compression: str) -> RobotLog:
    """The reader for rosbag2 storage files; `compression` is metadata.yaml's mode."""
    scratch, origins, broken = None, {}, None
    if compression == "file":
        scratch = tempfile.TemporaryDirectory(prefix="edgecap-log-")
        try:
            for file in files:
                try:
                    origins[_unpacked(file, Path(scratch.name))] = file
                except LogError as exc:  # a damaged split: the log ends before it
                    if not origins:
                        raise
                    broken = exc
                    break
        except BaseException:
            scratch.cleanup()
            raise
        files = list(origins)
    try:
        if storage == "mcap":
            log = McapLog(path, files, scratch, origins)
        elif storage == "sqlite3":
            log = SqliteLog(path, files, scratch)
        else:
            raise LogError(f"log {path}: storage {storage!r} is not supported; expected mcap or "
                           "sqlite3")
        if broken is not None:
            log.ends_before(broken)
        return log
    except BaseException:
        if scratch is not None:
            scratch.cleanup()
        raise


def _unpacked(file: Path, into: Path) -> Path:
    """A `--compression-mode file` storage file (<name>.zstd) decompressed into `into`; other
    files as they are (a killed recording's last file was never compressed)."""
    if file.suffix.lower() != ".zstd":
        return file
    zstandard = require("zstandard", "ros", "reading compressed rosbag2 logs")
    target = into / file.name[: -len(".zstd")]
    try:
        with file.open("rb") as src, target.open("wb") as dst:
            unpack = zstandard.ZstdDecompressor().decompressobj()
            while block := src.read(1 << 20):
                dst.write(unpack.decompress(block))
    except zstandard.ZstdError as exc:
        raise LogError(f"log {file}: does not decompress as zstd ({exc})") from None
    except OSError as exc:
        raise LogError(f"log {file}: cannot unpack it into {into} "
                       f"({exc.strerror or exc})") from None
    if not unpack.eof and target.stat().st_size == 0:
        raise LogError(f"log {file}: the compressed file ends before any of its content "
                       "(copied or written only in part?)")
    return target


def _rosbag2_metadata(metadata: Path) -> tuple[str, list[str], str]:
    """(storage identifier, relative file paths, compression mode: '', 'file' or 'message')."""
    yaml = require("ruamel.yaml", "ros", "reading rosbag2 metadata")
    try:
        info = yaml.YAML(typ="safe").load(metadata.read_text(encoding="utf-8"))
        info = info["rosbag2_bagfile_information"]
        storage = str(info["storage_identifier"])
        files = [str(f) for f in info["relative_file_paths"]]
        compression = str(info.get("compression_mode", "") or "").lower()
        fmt = str(info.get("compression_format", "") or "").lower()
    except (OSError, UnicodeDecodeError) as exc:
        raise LogError(f"log {metadata}: cannot read ({exc})") from None
    except Exception as exc:  # YAML syntax, missing keys, wrong types
        raise LogError(f"log {metadata}: not rosbag2 metadata ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else exc!r})") from None
    compression = "" if compression == "none" else compression
    if compression not in ("", "file", "message"):
        raise LogError(f"log {metadata}: compression_mode {compression!r} is not supported; "
                       "expected file or message")
    if compression and fmt != "zstd":
        raise LogError(f"log {metadata}: compression_format {fmt!r} is not supported; "
                       "expected zstd")
    missing = [f for f in files if not (metadata.parent / Path(f).name).is_file()]
    if missing:
        raise LogError(f"log {metadata.parent}: metadata.yaml lists {missing[0]}, which is missing")
    return storage, files, compression


def image_topic(log: RobotLog, wanted: str | None, flag: str = "--topic") -> Topic:
    """The image topic to read: `wanted`, or the only image topic; otherwise a one-line error
    listing the image topics."""
    images = sorted(t.name for t in log.topics.values() if t.msgtype in IMAGE_TYPES)
    listing = ", ".join(f"{n} ({log.topics[n].msgtype.rsplit('/', 1)[-1]}, "
                        f"{log.topics[n].count if log.topics[n].count is not None else '?'} msgs)"
                        for n in images)
    if wanted is None:
        if len(images) == 1:
            return log.topics[images[0]]
        if not images:
            raise LogError(f"log {log.path}: no image topics (sensor_msgs/msg/Image or "
                           f"CompressedImage); topics: {', '.join(sorted(log.topics)) or 'none'}")
        raise LogError(f"log {log.path} has {len(images)} image topics; choose one with "
                       f"{flag}: {listing}")
    topic = log.topics.get(wanted)
    if topic is None:
        raise LogError(f"log {log.path}: no topic {wanted!r}; image topics: {listing or 'none'}")
    if topic.msgtype not in IMAGE_TYPES:
        raise LogError(f"log {log.path}: topic {wanted} is {topic.msgtype or 'of unknown type'}, "
                       f"not sensor_msgs/msg/Image or CompressedImage; image topics: "
                       f"{listing or 'none'}")
    return topic
