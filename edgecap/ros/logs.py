"""Reading robot logs: rosbag2 directories (SQLite3 or MCAP storage), .mcap, .db3 and .bag files.

Two readers, chosen by storage (benchmarks/log_read.py measured them; docs/runtime.md has
the numbers):

    McapLog     mcap + mcap-ros2-support: .mcap files, and rosbag2 directories in MCAP storage.
                1.1-1.6x faster than rosbags on image topics, and it reads a recording that
                was cut short (no summary or footer) up to the cut, which rosbags refuses.
    RosbagsLog  rosbags: SQLite3 storage (.db3), compressed rosbag2 directories and ROS 1 .bag
                files, which the mcap library does not read.

Both hand out `(log_time_ns, message)` for one topic in log-time order, messages with their
fields as attributes; a message that does not deserialize comes out as `None` (skipped by the
source, not fatal). A log that cannot be opened, or breaks while being read, raises LogError:
one line naming the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgecap.errors import EdgecapError, require

from .images import IMAGE_TYPES

FILE_SUFFIXES = (".mcap", ".db3", ".bag")
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


class RobotLog:
    """A log opened for reading; `topics` maps topic name to Topic."""

    path: Path
    topics: dict[str, Topic]
    note: str | None = None      # something the user should know (a recording cut short)

    def messages(self, topic: str) -> Iterator[tuple[int, object | None]]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def is_log(path: Path) -> bool:
    """A file or directory `open_log` reads (decided by name, not by content)."""
    if path.is_file():
        return path.suffix.lower() in FILE_SUFFIXES
    if path.is_dir():
        return (path / "metadata.yaml").is_file() or any(
            p.suffix in (".mcap", ".db3") for p in path.iterdir())
    return False


def open_log(path: str | Path) -> RobotLog:
    path = Path(path)
    if not path.exists():
        raise LogError(f"log {path}: no such file or directory")
    if path.is_file():
        if path.suffix.lower() == ".mcap":
            return McapLog(path, [path])
        if path.suffix.lower() in (".db3", ".bag"):
            return RosbagsLog(path)
        raise LogError(f"log {path}: unknown log type {path.suffix!r}; expected a rosbag2 "
                       f"directory or a {', '.join(FILE_SUFFIXES)} file")
    metadata = path / "metadata.yaml"
    if not metadata.is_file():
        # `ros2 bag record` writes metadata.yaml when it stops; a killed recording has none.
        mcaps = sorted(path.glob("*.mcap"), key=_split_order)
        if mcaps:
            log = McapLog(path, mcaps)
            log.note = "; ".join(filter(None, [f"{path} has no metadata.yaml (recording "
                                               "stopped uncleanly?); read its .mcap files",
                                               log.note]))
            return log
        raise LogError(f"log {path}: no metadata.yaml and no .mcap files; not a rosbag2 directory")
    storage, files, compressed = _rosbag2_metadata(metadata)
    if storage == "mcap" and not compressed:
        return McapLog(path, [path / Path(f).name for f in files])
    return RosbagsLog(path)


def _split_order(path: Path):
    """run_0.mcap, run_1.mcap, ..., run_10.mcap in recording order."""
    m = re.search(r"_(\d+)$", path.stem)
    return (path.stem[: m.start()] if m else path.stem, int(m.group(1)) if m else -1)


def _rosbag2_metadata(metadata: Path) -> tuple[str, list[str], bool]:
    yaml = require("ruamel.yaml", "ros", "reading rosbag2 metadata")
    try:
        info = yaml.YAML(typ="safe").load(metadata.read_text(encoding="utf-8"))
        info = info["rosbag2_bagfile_information"]
        storage = str(info["storage_identifier"])
        files = [str(f) for f in info["relative_file_paths"]]
        compressed = str(info.get("compression_mode", "") or "").lower() not in ("", "none")
    except (OSError, UnicodeDecodeError) as exc:
        raise LogError(f"log {metadata}: cannot read ({exc})") from None
    except Exception as exc:  # YAML syntax, missing keys, wrong types
        raise LogError(f"log {metadata}: not rosbag2 metadata ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else exc!r})") from None
    missing = [f for f in files if not (metadata.parent / Path(f).name).is_file()]
    if missing:
        raise LogError(f"log {metadata.parent}: metadata.yaml lists {missing[0]}, which is missing")
    return storage, files, compressed


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- MCAP --------------------------------------------------------------------------------------
class McapLog(RobotLog):
    """One or more MCAP files read in order (a rosbag2 recording split into several files)."""

    def __init__(self, path: Path, files: list[Path]):
        require("mcap", "ros", "reading MCAP logs")
        require("mcap_ros2", "ros", "reading MCAP logs")
        from mcap_ros2.decoder import DecoderFactory

        self.path = path
        self.files = files
        self._decoders = DecoderFactory()
        self._indexed_files: set[Path] = set()
        self.topics = {}
        cut = []
        for file in files:
            channels, counts, times, indexed, damaged = self._index(file)
            if indexed:
                self._indexed_files.add(file)
            if damaged:
                cut.append(file.name)
            for channel_id, (topic, msgtype) in channels.items():
                count = counts.get(channel_id)
                first, last = times.get(channel_id, (None, None))
                old = self.topics.get(topic)
                if old is not None:
                    count = None if old.count is None or count is None else old.count + count
                    first = old.start_ns if old.start_ns is not None else first
                    last = last if last is not None else old.end_ns
                self.topics[topic] = Topic(topic, msgtype, count, first, last)
        if cut:
            self.note = (f"{', '.join(cut)}: no index (recording cut short?); read up to where "
                         f"the file ends; {RECOVER_HINT}")

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
                    stats = summary.statistics
                    counts = dict(stats.channel_message_counts) if stats else {}
                    times = _chunk_times(summary)
                    return channels, counts, times, True, False
        except McapError as exc:
            raise LogError(f"log {file}: not a readable MCAP file ({_first_line(exc)})") from None
        except OSError as exc:
            raise LogError(f"log {file}: cannot read ({exc.strerror or exc})") from None
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
        from mcap.records import Channel, Message, Schema
        from mcap.stream_reader import StreamReader

        schemas, channels = {}, {}
        with file.open("rb") as fh:
            try:
                for record in StreamReader(fh, skip_magic=False).records:
                    if isinstance(record, Schema):
                        schemas[record.id] = record
                    elif isinstance(record, Channel):
                        channels[record.id] = record
                        yield record, schemas.get(record.schema_id), None
                    elif isinstance(record, Message) and record.channel_id in channels:
                        channel = channels[record.channel_id]
                        yield channel, schemas.get(channel.schema_id), record
            except (McapError, ValueError, EOFError, OSError) as exc:
                if not channels:
                    raise LogError(f"log {file}: not a readable MCAP file "
                                   f"({_first_line(exc)})") from None

    def messages(self, topic: str):
        for file in self.files:
            yield from (self._indexed(file, topic) if file in self._indexed_files
                        else self._recovered(file, topic))

    def _decode(self, schema, channel, message):
        try:
            decoder = self._decoders.decoder_for(channel.message_encoding, schema)
            return decoder(message.data) if decoder is not None else None
        except Exception:  # a damaged message: the source counts it as skipped
            return None

    def _indexed(self, file: Path, topic: str):
        from mcap.exceptions import McapError
        from mcap.reader import SeekingReader

        count = 0
        try:
            with file.open("rb") as fh:
                for schema, channel, message in SeekingReader(fh).iter_messages(topics=[topic]):
                    count += 1
                    yield message.log_time, self._decode(schema, channel, message)
        except (McapError, ValueError, EOFError, OSError) as exc:
            raise LogError(f"log {file}: damaged after {count} messages on {topic} "
                           f"({_first_line(exc)}); {RECOVER_HINT}") from None

    def _recovered(self, file: Path, topic: str):
        for channel, schema, message in self._scan(file):
            if message is not None and channel.topic == topic:
                yield message.log_time, self._decode(schema, channel, message)


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
class RosbagsLog(RobotLog):
    """rosbags' AnyReader: rosbag2 in any storage, ROS 1 bags. Logs without embedded message
    definitions (rosbag2 before Iron) are read with the latest ROS 2 type store."""

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

    def close(self) -> None:
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
