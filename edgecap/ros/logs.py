"""Reading robot logs: rosbag2 directories (SQLite3 or MCAP storage), .mcap, .db3 and .bag files.

Three readers, chosen by storage (benchmarks/log_read.py measured them; docs/runtime.md has
the numbers):

    McapLog     mcap + mcap-ros2-support: .mcap files, and rosbag2 directories in MCAP storage.
                1.1-1.6x faster than rosbags on image topics, and it reads a recording that
                was cut short (no summary or footer) up to the cut, which rosbags refuses.
    SqliteLog   rosbags' storage reader: rosbag2's SQLite3 files (.db3), each read by its own
                topics table, images deserialised with rosbags' ROS 2 type store.
    RosbagsLog  rosbags' AnyReader: ROS 1 .bag files.

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
LogError: one line naming the file.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgecap.errors import EdgecapError, require

from .images import IMAGE_TYPES

FILE_SUFFIXES = (".mcap", ".db3", ".bag")
STORAGE_SUFFIXES = {".mcap": "mcap", ".db3": "sqlite3"}
RECOVER_HINT = "repair it with `mcap recover` or `ros2 bag reindex`"


class LogError(EdgecapError):
    """A log that cannot be read: missing, not a log, corrupt, or broken mid-way."""


@dataclass(frozen=True)
class Topic:
    name: str
    msgtype: str                 # ROS 2 spelling: sensor_msgs/msg/Image
    count: int | None            # messages on the topic, when the log says
    start_ns: int | None = None  # log time of its first and last message, when known
    end_ns: int | None = None

    @property
    def rate(self) -> float | None:
        """Mean message rate in Hz, when the log says enough to know it."""
        if not self.count or self.count < 2 or self.start_ns is None or self.end_ns is None \
                or self.end_ns <= self.start_ns:
            return None
        return (self.count - 1) / ((self.end_ns - self.start_ns) / 1e9)

    def joined(self, later: Topic) -> Topic:
        """This topic followed by its part in the next file of a split recording."""
        count = None if self.count is None or later.count is None else self.count + later.count
        first = self.start_ns if self.start_ns is not None else later.start_ns
        last = later.end_ns if later.end_ns is not None else self.end_ns
        return Topic(self.name, self.msgtype or later.msgtype, count, first, last)


class RobotLog:
    """A log opened for reading; `topics` maps topic name to Topic."""

    path: Path
    topics: dict[str, Topic]
    note: str | None = None      # something the user should know (a recording cut short)
    scratch: tempfile.TemporaryDirectory | None = None   # unpacked files, removed on close

    def messages(self, topic: str) -> Iterator[tuple[int, object | None]]:
        raise NotImplementedError

    def close(self) -> None:
        self._close_readers()
        if self.scratch is not None:
            self.scratch.cleanup()
            self.scratch = None

    def _close_readers(self) -> None:
        pass

    def add_note(self, text: str | None) -> None:
        self.note = "; ".join(filter(None, [self.note, text])) or None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
    scratch, origins = None, {}
    if compression == "file":
        scratch = tempfile.TemporaryDirectory(prefix="edgecap-log-")
        try:
            origins = {_unpacked(f, Path(scratch.name)): f for f in files}
        except BaseException:
            scratch.cleanup()
            raise
        files = list(origins)
    try:
        if storage == "mcap":
            return McapLog(path, files, scratch, origins)
        if storage == "sqlite3":
            return SqliteLog(path, files, scratch)
        raise LogError(f"log {path}: storage {storage!r} is not supported; expected mcap or "
                       "sqlite3")
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


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _payload(data: bytes) -> bytes | None:
    """A message's CDR bytes, decompressed when rosbag2 stored it zstd-compressed
    (`--compression-mode message`); None when that does not decompress."""
    if bytes(data[:4]) != ZSTD_MAGIC:
        return data
    zstandard = require("zstandard", "ros", "reading compressed rosbag2 logs")
    try:
        return zstandard.ZstdDecompressor().decompress(data)
    except zstandard.ZstdError:
        return None


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- MCAP --------------------------------------------------------------------------------------
class McapLog(RobotLog):
    """One or more MCAP files read in order (a rosbag2 recording split into several files)."""

    def __init__(self, path: Path, files: list[Path], scratch=None,
                 origins: dict[Path, Path] | None = None):
        require("mcap", "ros", "reading MCAP logs")
        require("mcap_ros2", "ros", "reading MCAP logs")
        from mcap_ros2.decoder import DecoderFactory

        self.path = path
        self.scratch = scratch
        self._origins = origins or {}   # unpacked file -> the user's <file>.zstd, for messages
        self.files = files
        self._decoders = DecoderFactory()
        self._by_schema: dict[tuple[Path, int], object] = {}
        self._indexed_files: set[Path] = set()
        self.topics = {}
        cut = []
        for file in files:
            channels, counts, times, indexed, damaged = self._index(file)
            if indexed:
                self._indexed_files.add(file)
            if damaged:
                cut.append(self._shown(file).name)
            for channel_id, (topic, msgtype) in channels.items():
                part = Topic(topic, msgtype, counts.get(channel_id),
                             *times.get(channel_id, (None, None)))
                old = self.topics.get(topic)
                self.topics[topic] = part if old is None else old.joined(part)
        if cut:
            self.add_note(f"{', '.join(cut)}: no index (recording cut short?); read up to "
                          f"where the file ends; {RECOVER_HINT}")
        if not self.topics and cut:
            raise LogError(f"log {path}: the recording was cut short before any message "
                           "reached the file")

    def _shown(self, file: Path) -> Path:
        return self._origins.get(file, file)

    def _index(self, file: Path):
        """channels {id: (topic, type)}, counts {id: n}, times {id: (first, last)}, whether
        the file has a chunk index, and whether its end is damaged (no valid footer)."""
        from mcap.exceptions import McapError
        from mcap.reader import SeekingReader

        damaged = False
        try:
            with file.open("rb") as fh:
                reader = SeekingReader(fh)
                try:
                    summary = reader.get_summary()
                except (McapError, ValueError, OSError, EOFError):
                    summary, damaged = None, True
                if summary is not None and summary.chunk_indexes:
                    channels = {cid: (c.topic, summary.schemas[c.schema_id].name
                                      if c.schema_id in summary.schemas else "")
                                for cid, c in summary.channels.items()}
                    stats = summary.statistics  # lists only channels that got messages
                    counts = {cid: stats.channel_message_counts.get(cid, 0)
                              for cid in channels} if stats else {}
                    times = _chunk_times(summary)
                    return channels, counts, times, True, False
        except McapError as exc:
            raise LogError(f"log {self._shown(file)}: not a readable MCAP file "
                           f"({_first_line(exc)})") from None
        except OSError as exc:
            raise LogError(f"log {self._shown(file)}: cannot read ({exc.strerror or exc})") from None
        # No summary (a recording cut short, or written without one): read it through once.
        channels, counts, times = {}, {}, {}
        for channel, schema, message in self._scan(file):
            if message is None:
                channels[channel.id] = (channel.topic, schema.name if schema else "")
                continue
            counts[channel.id] = counts.get(channel.id, 0) + 1
            first, _ = times.get(channel.id, (message.log_time, None))
            times[channel.id] = (first, message.log_time)
        return channels, counts, times, False, damaged

    def _scan(self, file: Path):
        """(channel, schema, None) per channel, (channel, schema, message) per message, in file
        order, stopping quietly where a damaged file stops making sense."""
        from mcap.exceptions import McapError
        from mcap.records import Channel, Header, Message, Schema
        from mcap.stream_reader import StreamReader

        schemas, channels = {}, {}
        header = False
        with file.open("rb") as fh:
            try:
                for record in StreamReader(fh, skip_magic=False).records:
                    header = header or isinstance(record, Header)
                    if isinstance(record, Schema):
                        schemas[record.id] = record
                    elif isinstance(record, Channel):
                        channels[record.id] = record
                        yield record, schemas.get(record.schema_id), None
                    elif isinstance(record, Message) and record.channel_id in channels:
                        channel = channels[record.channel_id]
                        yield channel, schemas.get(channel.schema_id), record
            except (McapError, ValueError, EOFError, OSError) as exc:
                # A recording killed before its first chunk reached the disk holds only the
                # header (rosbag2 writes schemas and channels into chunks): cut, not corrupt.
                if not channels and not header:
                    raise LogError(f"log {self._shown(file)}: not a readable MCAP file "
                                   f"({_first_line(exc)})") from None

    def messages(self, topic: str):
        for file in self.files:
            yield from (self._indexed(file, topic) if file in self._indexed_files
                        else self._recovered(file, topic))

    def _decode(self, file, schema, channel, message):
        data = _payload(message.data)
        if data is None:
            return None
        decoder = self._decoder(file, schema, channel)
        try:
            return decoder(data) if decoder is not None else None
        except Exception:  # a damaged message: the source counts it as skipped
            return None

    def _decoder(self, file, schema, channel):
        """mcap-ros2-support's decoder of the schema's `ros2msg` text; for an image type whose
        schema it cannot use (`ros2idl`, or left empty when the recorder did not find the
        definition), rosbags' built-in definition. Built once per schema."""
        key = (file, channel.schema_id)
        if key not in self._by_schema:
            import contextlib
            import io

            decoder = None
            try:
                with contextlib.redirect_stderr(io.StringIO()):  # its parser prints errors
                    decoder = self._decoders.decoder_for(channel.message_encoding, schema)
            except Exception:
                decoder = None
            if decoder is None and schema is not None and schema.name in IMAGE_TYPES \
                    and channel.message_encoding == "cdr":
                decoder = _builtin_decoder(schema.name)
            self._by_schema[key] = decoder
        return self._by_schema[key]

    def _indexed(self, file: Path, topic: str):
        from mcap.exceptions import McapError
        from mcap.reader import SeekingReader

        count = 0
        try:
            with file.open("rb") as fh:
                for schema, channel, message in SeekingReader(fh).iter_messages(topics=[topic]):
                    count += 1
                    yield message.log_time, self._decode(file, schema, channel, message)
        except (McapError, ValueError, EOFError, OSError) as exc:
            raise LogError(f"log {self._shown(file)}: damaged after {count} messages on {topic} "
                           f"({_first_line(exc)}); {RECOVER_HINT}") from None

    def _recovered(self, file: Path, topic: str):
        for channel, schema, message in self._scan(file):
            if message is not None and channel.topic == topic:
                yield message.log_time, self._decode(file, schema, channel, message)


def _chunk_times(summary) -> dict[int, tuple[int, int]]:
    """Per channel, the log-time span of the chunks that hold it (message indexes are per
    chunk, so this is exact at the ends only when the channel is the chunk's first / last)."""
    times: dict[int, tuple[int, int]] = {}
    for chunk in summary.chunk_indexes:
        for channel_id in chunk.message_index_offsets:
            first, last = times.get(channel_id, (chunk.message_start_time, chunk.message_end_time))
            times[channel_id] = (min(first, chunk.message_start_time),
                                 max(last, chunk.message_end_time))
    return times


# -- rosbags -----------------------------------------------------------------------------------
_STORE = None


def _builtin_decoder(msgtype: str):
    """Deserialise CDR bytes of `msgtype` with rosbags' latest ROS 2 definitions. The image
    messages have had the same fields since ROS 2's first release, so this reads any distro's."""
    global _STORE
    if _STORE is None:
        require("rosbags", "ros", "ROS 2 message definitions")
        from rosbags.typesys import Stores, get_typestore

        _STORE = get_typestore(Stores.LATEST)
    if msgtype not in _STORE.fielddefs:
        return None
    return lambda data: _STORE.deserialize_cdr(data, msgtype)


class SqliteLog(RobotLog):
    """rosbag2's SQLite3 storage: .db3 files read in order with rosbags' storage reader, each by
    its own topics table. Image messages are deserialised with rosbags' built-in definitions, so
    neither a bag without embedded definitions (before Iron) nor another topic's definition or
    type hash can stop the image topic from being read.

    A database recorded with the `resilient` preset (SQLite's write-ahead log) by a recorder that
    was killed keeps its newest messages in `<file>-wal`; such a file is copied with its log into
    a temporary directory and checkpointed there, so nothing beside the user's log is changed."""

    def __init__(self, path: Path, files: list[Path], scratch=None):
        require("rosbags", "ros", "reading rosbag2 SQLite3 logs")
        from rosbags.rosbag2 import Reader

        self.path = path
        self.scratch = scratch
        self.topics = {}
        self._readers = []
        try:
            for file in files:
                reader = Reader(self._with_wal(file))
                self._readers.append(reader)
                reader.open()
                span = (reader.start_time, reader.end_time - 1) \
                    if reader.message_count else (None, None)
                for conn in reader.connections:
                    part = Topic(conn.topic, conn.msgtype, conn.msgcount,
                                 *(span if conn.msgcount else (None, None)))
                    old = self.topics.get(conn.topic)
                    self.topics[conn.topic] = part if old is None else old.joined(part)
        except LogError:
            self.close()
            raise
        except Exception as exc:  # rosbags, sqlite3 and YAML errors have no common base
            self.close()
            raise LogError(f"log {path}: cannot read ({_first_line(exc)}); {RECOVER_HINT}") from None

    def _with_wal(self, file: Path) -> Path:
        wal = file.with_name(file.name + "-wal")
        if not wal.is_file() or wal.stat().st_size == 0:
            return file
        if self.scratch is None:
            self.scratch = tempfile.TemporaryDirectory(prefix="edgecap-log-")
        copy = Path(self.scratch.name) / file.name
        try:
            shutil.copyfile(file, copy)
            shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
            with sqlite3.connect(copy) as con:
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                con.execute("PRAGMA journal_mode=DELETE")
            con.close()
        except (OSError, sqlite3.Error) as exc:
            raise LogError(f"log {file}: cannot read it with its write-ahead log {wal.name} "
                           f"({exc}); {RECOVER_HINT}") from None
        self.add_note(f"{file.name}: read with the messages still in {wal.name} (recording "
                      "stopped uncleanly?)")
        return copy

    def messages(self, topic: str):
        count = 0
        for reader in self._readers:
            connections = [c for c in reader.connections if c.topic == topic]
            if not connections:
                continue
            decode = _builtin_decoder(connections[0].msgtype)
            try:
                for _, log_ns, raw in reader.messages(connections=connections):
                    count += 1
                    raw = _payload(raw)
                    try:
                        msg = decode(raw) if decode is not None and raw is not None else None
                    except Exception:
                        msg = None
                    yield log_ns, msg
            except Exception as exc:
                raise LogError(f"log {self.path}: damaged after {count} messages on {topic} "
                               f"({_first_line(exc)}); {RECOVER_HINT}") from None

    def _close_readers(self) -> None:
        for reader in self._readers:
            if getattr(reader, "is_open", False):
                reader.close()
        self._readers = []


class RosbagsLog(RobotLog):
    """rosbags' AnyReader: ROS 1 bags (and, for benchmarks/log_read.py, any rosbag2 log)."""

    def __init__(self, path: Path):
        require("rosbags", "ros", "reading rosbag2 / ROS 1 logs")
        from rosbags.highlevel import AnyReader
        from rosbags.typesys import Stores, get_typestore

        self.path = path
        try:
            self._reader = AnyReader([path], default_typestore=get_typestore(Stores.LATEST))
            self._reader.open()
            self.topics = {
                name: Topic(name, info.msgtype or "", info.msgcount)
                for name, info in self._reader.topics.items()}
            start, end = self._reader.start_time, self._reader.end_time
        except Exception as exc:  # rosbags, sqlite3 and YAML errors have no common base
            raise LogError(f"log {path}: cannot read ({_first_line(exc)}); {RECOVER_HINT}") from None
        if start < end:  # rosbags knows the log's span, not each topic's
            self.topics = {n: Topic(t.name, t.msgtype, t.count, start, end - 1)
                           for n, t in self.topics.items()}

    def messages(self, topic: str):
        reader = self._reader
        connections = [c for c in reader.connections if c.topic == topic]
        count = 0
        try:
            for connection, log_ns, raw in reader.messages(connections=connections):
                count += 1
                try:
                    msg = reader.deserialize(raw, connection.msgtype)
                except Exception:
                    msg = None
                yield log_ns, msg
        except Exception as exc:
            raise LogError(f"log {self.path}: damaged after {count} messages on {topic} "
                           f"({_first_line(exc)}); {RECOVER_HINT}") from None

    def _close_readers(self) -> None:
        if getattr(self, "_reader", None) is not None and self._reader.stack is not None:
            self._reader.close()


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
