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
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from edgecap.errors import EdgecapError, require
from edgecap.io import RunOutput, probe_writable

from .captions import FOXGLOVE_MSGS

OWNER_METADATA = "edgecap"

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
        from mcap_ros2.writer import Writer

        from edgecap import __version__

        self.path = check_target(path, flag)
        self.flag = flag
        super().__init__(self.path, flag)
        try:
            self._fh = self.tmp.open("wb")
        except OSError as exc:
            self._work.close()
            raise EdgecapError(f"{flag} {self.path}: cannot write ({exc.strerror or exc})") from None
        self._writer = Writer(self._fh)
        self._writer.add_metadata(OWNER_METADATA, {"version": __version__, **(metadata or {})})
        self._schemas: dict[str, object] = {}
        self.count = 0

    def write(self, topic: str, typename: str, fields: dict, log_time_ns: int,
              publish_time_ns: int | None = None) -> None:
        schema = self._schemas.get(typename)
        if schema is None:
            # Schema names as rosbag2's MCAP storage writes them: sensor_msgs/msg/Image.
            schema = self._schemas[typename] = self._writer.register_msgdef(
                typename, msgdef(typename))
        try:
            self._writer.write_message(topic, schema, fields, log_time=int(log_time_ns),
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
