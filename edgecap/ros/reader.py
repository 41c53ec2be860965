"""What every robot-log reader shares: the reader interface, topics, the one error type, and
the decoding of a message's bytes (rosbag2's message compression, built-in image definitions)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgecap.errors import EdgecapError, require

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
    """A log opened for reading; `topics` maps topic name to Topic.

    A split recording is read file by file. When a file after the first cannot be opened at all
    (a .db3 cut short, a `.zstd` that does not decompress), the log ends before it: its topics
    are those of the files before it, `messages` hands out their messages and then raises
    `broken`, one LogError naming that file, as a log damaged mid-way does (`until_damaged`)."""

    path: Path
    topics: dict[str, Topic]
    note: str | None = None      # something the user should know (a recording cut short)
    scratch: tempfile.TemporaryDirectory | None = None   # unpacked files, removed on close
    broken: LogError | None = None   # why the split file after the last one read could not be opened

    def messages(self, topic: str) -> Iterator[tuple[int, object | None]]:
        """(log time ns, message or None when it does not deserialise) on `topic`, in log-time order."""
        count = 0
        for item in self._messages(topic):
            count += 1
            yield item
        if self.broken is not None:
            raise LogError(f"{self.broken}; the log was read up to it ({count} messages on {topic})")

    def _messages(self, topic: str) -> Iterator[tuple[int, object | None]]:
        raise NotImplementedError

    def ends_before(self, error: LogError) -> None:
        """Record that the split file after those opened could not be opened (`error` names it)."""
        if self.broken is None:
            self.broken = error
            self.add_note(f"{error}; the log ends before it")

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


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def payload(data: bytes) -> bytes | None:
    """A message's CDR bytes, decompressed when rosbag2 stored it zstd-compressed
    (`--compression-mode message`); None when that does not decompress."""
    if bytes(data[:4]) != ZSTD_MAGIC:
        return data
    zstandard = require("zstandard", "ros", "reading compressed rosbag2 logs")
    try:
        return zstandard.ZstdDecompressor().decompress(data)
    except zstandard.ZstdError:
        return None


_STORES: dict[str, object] = {}


def builtin_decoder(msgtype: str, encoding: str = "cdr"):
    """Deserialise a message of `msgtype` with rosbags' built-in definitions: CDR bytes (ROS 2)
    with the latest ROS 2 ones, `ros1` bytes (an MCAP converted from a ROS 1 bag) with ROS 1
    Noetic's. The image messages have had the same fields since each ROS's first release (ROS 1
    headers add `seq`), so this reads any distro's. None for a type or encoding it does not know."""
    if encoding not in ("cdr", "ros1"):
        return None
    if encoding not in _STORES:
        require("rosbags", "ros", "ROS message definitions")
        from rosbags.typesys import Stores, get_typestore

        _STORES[encoding] = get_typestore(Stores.LATEST if encoding == "cdr" else Stores.ROS1_NOETIC)
    store = _STORES[encoding]
    if msgtype not in store.fielddefs:
        return None
    if encoding == "ros1":
        return lambda data: store.deserialize_ros1(data, msgtype)
    return lambda data: store.deserialize_cdr(data, msgtype)


def ros2_type_name(name: str) -> str:
    """A message type in ROS 2's spelling: ROS 1 names it `sensor_msgs/Image` (so do MCAP files
    converted from ROS 1 bags, profile `ros1`), ROS 2 `sensor_msgs/msg/Image`."""
    package, _, rest = name.partition("/")
    return f"{package}/msg/{rest}" if package and rest and "/" not in rest else name


def decoded(decode, data, *args):
    """`decode(data, *args)`, or None for a message with nothing to decode (no decoder, a
    compressed payload that did not decompress) or that does not deserialise: the source
    counts it as skipped, the log goes on."""
    if decode is None or data is None:
        return None
    try:
        return decode(data, *args)
    except Exception:
        return None


def until_damaged(where, topic: str, messages: Iterator, errors=(Exception,)) -> Iterator:
    """`messages` passed on; a log that breaks while being read (`errors`) ends them with one
    LogError naming where, and how many messages on `topic` came before the damage."""
    count = 0
    try:
        for item in messages:
            count += 1
            yield item
    except errors as exc:
        raise LogError(f"log {where}: damaged after {count} messages on {topic} "
                       f"({first_line(exc)}); {RECOVER_HINT}") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
