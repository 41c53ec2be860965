"""Logs read with rosbags: rosbag2's SQLite3 storage (.db3) and ROS 1 .bag files."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

from edgecap.errors import require

from .reader import (
    RECOVER_HINT,
    LogError,
    RobotLog,
    Topic,
    builtin_decoder,
    decoded,
    first_line,
    payload,
    until_damaged,
)


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
        self.path = path
        self.scratch = scratch
        self.topics = {}
        self._readers = []
        try:
            for k, file in enumerate(files):
                reader = self._opened(file, first=k == 0)
                if reader is None:  # damaged: the log ends before it
                    break
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
            raise LogError(f"log {path}: cannot read ({first_line(exc)}); {RECOVER_HINT}") from None

    def _opened(self, file: Path, first: bool):
        """rosbags' reader of one .db3, open; None when it is not the first file and cannot be
        opened (the log then ends before it); a first file that cannot is a LogError."""
        from rosbags.rosbag2 import Reader

        try:
            reader = Reader(self._with_wal(file))
            self._readers.append(reader)
            reader.open()
            return reader
        except Exception as exc:  # rosbags, sqlite3 and YAML errors have no common base
            error = exc if isinstance(exc, LogError) else \
                LogError(f"log {file}: cannot read ({first_line(exc)}); {RECOVER_HINT}")
            if first:
                raise error from None
            self.ends_before(error)
            return None

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

    def _messages(self, topic: str):
        return until_damaged(self.path, topic, self._rows(topic))

    def _rows(self, topic: str):
        for reader in self._readers:
            if not getattr(reader, "is_open", False):  # the damaged file the log ends before
                continue
            connections = [c for c in reader.connections if c.topic == topic]
            if not connections:
                continue
            decode = builtin_decoder(connections[0].msgtype)
            for _, log_ns, raw in reader.messages(connections=connections):
                yield log_ns, decoded(decode, payload(raw))

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
            raise LogError(f"log {path}: cannot read ({first_line(exc)}); {RECOVER_HINT}") from None
        if start < end:  # rosbags knows the log's span, not each topic's
            self.topics = {n: Topic(t.name, t.msgtype, t.count, start, end - 1)
                           for n, t in self.topics.items()}

    def _messages(self, topic: str):
        reader = self._reader
        connections = [c for c in reader.connections if c.topic == topic]
        return until_damaged(self.path, topic, (
            (log_ns, decoded(reader.deserialize, raw, connection.msgtype))
            for connection, log_ns, raw in reader.messages(connections=connections)))

    def _close_readers(self) -> None:
        if getattr(self, "_reader", None) is not None and self._reader.stack is not None:
            self._reader.close()
