"""MCAP storage read with mcap + mcap-ros2-support: .mcap files and rosbag2 directories in MCAP
storage, also a recording cut short (no summary or footer), read up to the cut."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from edgecap.errors import require

from .images import IMAGE_TYPES
from .reader import (
    RECOVER_HINT,
    LogError,
    RobotLog,
    Topic,
    builtin_decoder,
    decoded,
    first_line,
    payload,
    ros2_type_name,
    until_damaged,
)


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
        for k, file in enumerate(files):
            try:
                channels, counts, times, indexed, damaged = self._index(file)
            except LogError as exc:
                if k == 0:
                    raise
                self.files = files[:k]  # the log ends before the file that cannot be read
                self.ends_before(exc)
                break
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
                    channels = {cid: (c.topic, ros2_type_name(summary.schemas[c.schema_id].name)
                                      if c.schema_id in summary.schemas else "")
                                for cid, c in summary.channels.items()}
                    stats = summary.statistics  # lists only channels that got messages
                    counts = {cid: stats.channel_message_counts.get(cid, 0)
                              for cid in channels} if stats else {}
                    times = _chunk_times(summary)
                    return channels, counts, times, True, False
        except McapError as exc:
            raise LogError(f"log {self._shown(file)}: not a readable MCAP file "
                           f"({first_line(exc)})") from None
        except OSError as exc:
            raise LogError(f"log {self._shown(file)}: cannot read ({exc.strerror or exc})") from None
        # No summary (a recording cut short, or written without one): read it through once.
        channels, counts, times = {}, {}, {}
        for channel, schema, message in self._scan(file):
            if message is None:
                channels[channel.id] = (channel.topic, ros2_type_name(schema.name) if schema else "")
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
                                   f"({first_line(exc)})") from None

    def _messages(self, topic: str):
        for file in self.files:
            yield from (self._indexed(file, topic) if file in self._indexed_files
                        else self._recovered(file, topic))

    def _decode(self, file, schema, channel, message):
        return decoded(self._decoder(file, schema, channel), payload(message.data))

    def _decoder(self, file, schema, channel):
        """mcap-ros2-support's decoder of the schema's `ros2msg` text; for an image type whose
        schema it cannot use (`ros2idl`, left empty when the recorder did not find the
        definition, or a ROS 1 message in an MCAP converted from a ROS 1 bag), rosbags'
        built-in definition. Built once per schema."""
        key = (file, channel.schema_id)
        if key not in self._by_schema:
            decoder = None
            try:
                with contextlib.redirect_stderr(io.StringIO()):  # its parser prints errors
                    decoder = self._decoders.decoder_for(channel.message_encoding, schema)
            except Exception:
                decoder = None
            msgtype = ros2_type_name(schema.name) if schema is not None else ""
            if decoder is None and msgtype in IMAGE_TYPES:
                decoder = builtin_decoder(msgtype, channel.message_encoding)
            self._by_schema[key] = decoder
        return self._by_schema[key]

    def _indexed(self, file: Path, topic: str):
        from mcap.exceptions import McapError
        from mcap.reader import SeekingReader

        def read():
            with file.open("rb") as fh:
                for schema, channel, message in SeekingReader(fh).iter_messages(topics=[topic]):
                    yield message.log_time, self._decode(file, schema, channel, message)

        return until_damaged(self._shown(file), topic, read(), (McapError, ValueError, EOFError, OSError))

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
