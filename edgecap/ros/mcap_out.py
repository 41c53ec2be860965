"""Writing MCAP logs of ROS 2 messages (CDR, `ros2msg` schemas) that Foxglove, `ros2 bag` and
rosbags read.

Messages are given as dicts of their fields (edgecap.ros.images / captions build them) and
encoded by mcap-ros2-support from the message definitions. The standard definitions
(std_msgs, sensor_msgs, builtin_interfaces) come from rosbags' ROS 2 type store; the
foxglove_msgs ones (edgecap.ros.captions.FOXGLOVE_MSGS) are the field lists of the ROS 2
package foxglove_msgs, the ROS encoding of the foxglove.ImageAnnotations schema, so Foxglove's
Image panel draws them.

The file is written in a work directory beside its target (`edgecap.io.WorkDir`) and renamed
when `close()` finishes it, so the target name only ever holds a complete, indexed MCAP file; a
run stopped by SIGINT / SIGTERM still closes it, and the work directory of a killed writer is
removed by the next write of the same target. Each log carries an MCAP metadata record "edgecap", which is
how an existing file is recognised as ours: any other file under the target name is refused,
never overwritten.

Every channel carries the `ros2` profile's channel metadata as `ros2 bag record` writes it:
`offered_qos_profiles` (see OFFERED_QOS) and `topic_type_hash` (the type's RIHS01 hash, as
Jazzy and later record it). The file itself goes through the mcap library's Writer, so the
channels are registered here; the CDR payloads are encoded by mcap-ros2-support's encoder, the
one its own Writer uses (which has no way to give a channel metadata).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from edgecap import __version__
from edgecap.errors import EdgecapError, require
from edgecap.io import RunOutput, probe_writable

from .captions import FOXGLOVE_MSGS

OWNER_METADATA = "edgecap"
# RMW_DURATION_INFINITE as the middleware reports an unset deadline / lifespan / lease.
INFINITE_SEC, INFINITE_NSEC = 9223372036, 854775807

_TYPESTORE = None


def _typestore():
    global _TYPESTORE
    if _TYPESTORE is None:
        require("rosbags", "ros", "ROS 2 message definitions")
        from rosbags.typesys import Stores, get_types_from_msg, get_typestore

        store = get_typestore(Stores.LATEST)
        for name, text in FOXGLOVE_MSGS.items():
            store.register(get_types_from_msg(text, name))
        _TYPESTORE = store
    return _TYPESTORE


def msgdef(typename: str) -> str:
    """The `ros2msg` schema text of a type: its definition, then each dependency's."""
    store = _typestore()
    if typename not in store.fielddefs:
        raise EdgecapError(f"unknown ROS 2 message type {typename}")
    return store.generate_msgdef(typename, ros_version=2)[0]


def offered_qos() -> str:
    """`offered_qos_profiles` of every channel we write: one publisher offering reliable,
    volatile delivery (rclcpp / rclpy's default profile: the caption node's publishers, and
    image_transport's default that usb_cam, v4l2_camera and gscam publish images with), as
    `ros2 bag record` reads it from the ROS graph: history unknown, depth 0, deadline,
    lifespan and lease infinite, liveliness automatic. Reliable is also the offer every
    subscriber accepts when `ros2 bag play` re-offers it, best-effort ones (the caption node's
    image subscription) included.

    The layout is the integer one Humble writes (rosbag2 metadata version < 9). rosbag2 reads a
    channel's QoS by the version in the file's `rosbag2` metadata record and takes 8 when there
    is none, as here; Jazzy's policy names would then fail to parse, integers parse on every
    distro since Humble.
    """
    from rosbags.interfaces import (
        Qos,
        QosDurability,
        QosHistory,
        QosLiveliness,
        QosReliability,
        QosTime,
    )
    from rosbags.rosbag2.metadata import dump_qos_v8

    infinite = QosTime(INFINITE_SEC, INFINITE_NSEC)
    return dump_qos_v8([Qos(QosHistory.UNKNOWN, 0, QosReliability.RELIABLE,
                            QosDurability.VOLATILE, infinite, infinite, QosLiveliness.AUTOMATIC,
                            infinite, False)])


def channel_metadata(typename: str) -> dict[str, str]:
    """The `ros2` profile's channel metadata for a topic of `typename`."""
    return {"offered_qos_profiles": offered_qos(),
            "topic_type_hash": _typestore().hash_rihs01(typename)}


def written_by_edgecap(path: Path) -> bool:
    """True when `path` is an MCAP file with edgecap's metadata record."""
    from mcap.exceptions import McapError
    from mcap.reader import make_reader

    try:
        with path.open("rb") as fh:
            return any(m.name == OWNER_METADATA for m in make_reader(fh).iter_metadata())
    except (McapError, OSError, ValueError, EOFError, KeyError, StopIteration):
        return False


def check_target(path: str | os.PathLike, flag: str = "--out-mcap") -> Path:
    """Refuse, before any slow work, a target that is a directory, a file edgecap did not
    write, or a place that cannot be written."""
    path = Path(path)
    if path.exists() and not path.is_dir() and not written_by_edgecap(path):
        raise EdgecapError(f"{flag} {path} exists and is not an MCAP log written by edgecap; "
                           "not overwriting it (remove it or choose another path)")
    probe_writable(path, flag, file=True)
    return path


class McapLogWriter(RunOutput):
    """`write(topic, typename, fields, log_time_ns)` then `close()`; `flag` names the option
    in error messages."""

    def __init__(self, path: str | os.PathLike, flag: str = "--out-mcap",
                 metadata: dict[str, str] | None = None):
        require("mcap", "ros", "writing MCAP logs")
        require("mcap_ros2", "ros", "writing MCAP logs")
        from mcap.well_known import MessageEncoding, Profile
        from mcap.writer import LIBRARY_IDENTIFIER, CompressionType, Writer

        self.path = check_target(path, flag)
        self.flag = flag
        super().__init__(self.path, flag)
        try:
            self._fh = self.tmp.open("wb")
        except OSError as exc:
            self._work.close()
            raise EdgecapError(f"{flag} {self.path}: cannot write ({exc.strerror or exc})") from None
        self._writer = Writer(self._fh, compression=CompressionType.ZSTD)
        self._writer.start(profile=Profile.ROS2,
                           library=f"{LIBRARY_IDENTIFIER} edgecap/{__version__}")
        self._encoding = MessageEncoding.CDR
        self._writer.add_metadata(OWNER_METADATA, {"version": __version__, **(metadata or {})})
        self._schemas: dict[str, int] = {}
        self._encoders: dict[str, object] = {}
        self._channels: dict[str, int] = {}
        self.count = 0

    def _channel(self, topic: str, typename: str) -> int:
        channel = self._channels.get(topic)
        if channel is None:
            from mcap.well_known import SchemaEncoding
            from mcap_ros2._dynamic import serialize_dynamic

            schema = self._schemas.get(typename)
            if schema is None:
                # Schema names as rosbag2's MCAP storage writes them: sensor_msgs/msg/Image.
                text = msgdef(typename)
                schema = self._schemas[typename] = self._writer.register_schema(
                    typename, SchemaEncoding.ROS2, text.encode())
                self._encoders[typename] = serialize_dynamic(typename, text)[typename]
            channel = self._channels[topic] = self._writer.register_channel(
                topic, self._encoding, schema, channel_metadata(typename))
        return channel

    def write(self, topic: str, typename: str, fields: dict, log_time_ns: int,
              publish_time_ns: int | None = None) -> None:
        channel = self._channel(topic, typename)
        data = self._encoders[typename](fields)
        try:
            self._writer.add_message(channel, log_time=int(log_time_ns), data=data,
                                     publish_time=int(publish_time_ns if publish_time_ns
                                                      is not None else log_time_ns),
                                     sequence=self.count)
        except OSError as exc:
            raise EdgecapError(f"{self.flag} {self.path}: write failed "
                               f"({exc.strerror or exc})") from None
        self.count += 1

    def _finish_file(self) -> None:
        """Summary, index and footer, flushed to the disk."""
        try:
            self._writer.finish()
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
        except BaseException as exc:
            with contextlib.suppress(OSError):
                self._fh.close()
            if isinstance(exc, OSError):
                raise EdgecapError(f"{self.flag} {self.path}: cannot finish the log "
                                   f"({exc.strerror or exc})") from None
            raise

    def abort(self) -> None:
        """Drop the unfinished file (used when the log could not be finished)."""
        with contextlib.suppress(OSError):
            self._fh.close()
        super().abort()
