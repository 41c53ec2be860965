"""Frame sources: camera index, video file, RTSP/HTTP URL, image folder, ACVR sequence, synth,
robot log (rosbag2 / MCAP).

A source only reads; the capture thread (camera.py) stamps frame ids and timestamps and keeps
the newest frame. `read()` returns one `Captured` frame or raises:

    EndOfStream   the source is exhausted (files, folders, sequences)
    BadFrame      this frame could not be decoded; the next read moves on (skipped, counted)
    StreamLost    the device / connection went away; close() + open() may bring it back

Nothing here ever returns a frame it did not read (no black or repeated frames on a stall).
`open_source(spec)` turns a command-line string into a source.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np

from edgecap.contract.objects import KnownObject
from edgecap.data.acvr import load_sequences
from edgecap.errors import EdgecapError
from edgecap.image_damage import damage
from edgecap.io import stderr_lines

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
STREAM_SCHEMES = ("rtsp", "rtsps", "rtmp", "http", "https", "udp", "tcp")
SOURCE_HELP = ("a camera index (0), a video file, an rtsp:// or http:// URL, an image folder, "
               "an ACVR sequence folder, a rosbag2 directory or .mcap / .db3 / .bag log, "
               "or synth://tabletop[?seed=S&size=N&fps=F&scene=SECONDS]")


class EndOfStream(Exception):
    """The source has no more frames."""


class BadFrame(Exception):
    """One frame could not be decoded; the source has moved past it."""


class StreamLost(Exception):
    """The device or connection dropped; reopening may recover it."""


class SourceOpenError(EdgecapError):
    """A source that cannot be opened at all."""


# OpenCV's FFmpeg backend waits 30 s by default for a camera that does not answer, and as long
# for a frame of a stalled stream; a robot's launch should fail in seconds and say why, and a
# stalled stream be reopened sooner (camera.py).
STREAM_TIMEOUT_S = 10.0

# what to look at when OpenCV cannot open a source, by kind
OPEN_ADVICE = {
    "stream": "check that the camera is on and reachable from this machine (host, port), the "
              "URL's path and the user name and password; ffprobe URL shows what FFmpeg sees",
    "video": "check that the file is a complete video FFmpeg can decode (ffprobe FILE)",
    "camera": "check that the device exists (v4l2-ctl --list-devices), that no other process "
              "holds it, and that this user may read it (the video group)",
}


def masked(source: str) -> str:
    """A source string with a URL's password replaced by *** (rtsp://admin:***@10.0.0.5/stream):
    it is printed, logged and written into records and summaries."""
    text = str(source)
    if "://" not in text:
        return text
    netloc = urlsplit(text).netloc
    userinfo, at, host = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return text
    return text.replace(netloc, f"{userinfo.split(':', 1)[0]}:***@{host}", 1)


def folder_images(path: Path) -> list[Path]:
    """The images directly in `path`, in name order (subfolders are not searched). An image name
    that is a symbolic link going nowhere (a loop, a missing target) is listed too, so that
    reading it is a counted, named skip rather than a file silently left out."""
    return sorted(p for p in path.iterdir()
                  if p.suffix.lower() in IMAGE_SUFFIXES and (p.is_file() or _broken_link(p)))


def _broken_link(path: Path) -> bool:
    return path.is_symlink() and not path.exists()


def read_image(path: Path) -> np.ndarray:
    """The image file at `path` as HxWx3 uint8 BGR; BadFrame naming the file and the reason when
    it cannot be read, is a symbolic link loop, or is damaged (edgecap.image_damage)."""
    import cv2

    try:
        data = path.read_bytes()
    except OSError as exc:
        reason = "symbolic link loop" if exc.errno == errno.ELOOP else \
            "broken symbolic link" if _broken_link(path) else exc.strerror
        raise BadFrame(f"{path}: cannot read ({reason})") from None
    problem = damage(data)
    if problem:
        raise BadFrame(f"{path}: {problem}")
    # decoded from the bytes just checked: the file is read once, and what is decoded is what
    # was checked even if the file changes meanwhile (imdecode applies EXIF orientation as imread does)
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as exc:  # OpenCV asserts instead of returning None on some inputs
        raise BadFrame(f"{path}: cannot decode ({str(exc).strip().splitlines()[-1][:160]})") from None
    return check_image(image, str(path))


def no_images_reason(path: Path) -> str:
    """Why a folder gave no images, naming the subfolders that hold some (a COCO-style layout
    such as images/train2014 + images/val2014 is read one split at a time)."""
    with_images = sorted(d.name for d in path.iterdir() if d.is_dir() and folder_images(d))
    reason = f"folder holds no images ({', '.join(IMAGE_SUFFIXES)})"
    if with_images:
        names = ", ".join(with_images[:4]) + (", ..." if len(with_images) > 4 else "")
        reason += f"; its subfolders {names} do: give one of them"
    return reason


def world_objects(objects: list[dict], width: int, height: int, area: str = "box") -> list[KnownObject]:
    """The synthetic world's ground-truth records (class, inclusive box, `area` = mask pixel
    fraction) as KnownObjects whose area is the coverage area `area` asks for: the box
    (default, as `eval coverage`) or the pixels."""
    return [KnownObject.measured(o["class"], o["box"], o.get("area"), width, height, area) for o in objects]


@dataclass(frozen=True)
class LogStamp:
    """Where a logged image sits in time: its header stamp and the log's record time (ns)."""

    header_ns: int                           # std_msgs/Header stamp: when the camera took it
    log_ns: int                              # when the recorder received it (MCAP log_time)
    frame_id: str = ""                       # std_msgs/Header frame_id (the camera's frame)

    def to_json(self) -> dict:
        return {"header_stamp_ns": self.header_ns, "log_time_ns": self.log_ns,
                "header_frame_id": self.frame_id}


@dataclass
class Captured:
    """What a source read: the image, and what it knows about it."""

    image: np.ndarray                        # HxWx3 uint8 BGR
    index: int | None = None                 # position in a file/folder/sequence; None for cameras
    objects: list[KnownObject] | None = None
    image_id: str | None = None              # the dataset's name for the frame (ACVR "<seq>/<frame>")
    stamp: LogStamp | None = None            # logged images: header stamp and log time
    due: float | None = None                 # seconds after the first frame it was recorded


class Source:
    """Base class. `live` sources run at the device's rate and cannot be paced or replayed.
    `timed` sources say when each frame is due (Captured.due), so they replay without an fps."""

    name: str = "source"
    live: bool = False
    timed: bool = False
    fps: float | None = None                 # native frame rate, when the source has one

    def open(self) -> None:
        raise NotImplementedError

    def read(self) -> Captured:
        raise NotImplementedError

    def close(self) -> None:
        pass


def check_image(image, where: str) -> np.ndarray:
    """A decoded frame must be HxWx3 uint8; anything else is an undecodable frame."""
    if image is None:
        raise BadFrame(f"{where}: cannot decode frame")
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 \
            or image.shape[2] != 3 or image.shape[0] == 0 or image.shape[1] == 0:
        shape = getattr(image, "shape", None)
        raise BadFrame(f"{where}: frame has shape {shape} dtype {getattr(image, 'dtype', None)}, "
                       "expected HxWx3 uint8")
    return image


class CaptureSource(Source):
    """Anything cv2.VideoCapture opens: a camera index, a video file or a stream URL.

    Frames are fetched with grab() + retrieve(), so a packet that arrives but does not decode
    (retrieve fails) is a bad frame, while a grab that fails is the end of a file or a lost
    stream. A video file that fails before its last frame is reopened at the same position
    once; a second failure there is taken as the end of the file (truncated files often
    over-report their frame count).
    """

    def __init__(self, target: int | str, kind: str, fps: float | None = None):
        self.target = target
        self.kind = kind                      # "camera" | "stream" | "video"
        self.name = f"camera {target}" if kind == "camera" else masked(str(target))
        self.live = kind in ("camera", "stream")
        self._fps_override = fps
        self.fps = fps
        self.cap = None
        self.position = 0                     # next frame index of a video file
        self.frame_count: int | None = None
        self._failed_at: int | None = None

    def _backend(self) -> tuple[int, str]:
        """(apiPreference, what it is called in messages): a stream goes to FFmpeg by name, with
        the open timeout; without FFmpeg (some Jetson builds) and for files and cameras OpenCV
        tries its backends in its own order."""
        import cv2

        registry = cv2.videoio_registry
        if self.kind == "stream" and registry.hasBackend(cv2.CAP_FFMPEG):
            return cv2.CAP_FFMPEG, "OpenCV's FFMPEG backend"
        ids = registry.getCameraBackends() if self.kind == "camera" else registry.getStreamBackends()
        return cv2.CAP_ANY, f"OpenCV (backends tried: {', '.join(registry.getBackendName(b) for b in ids)})"

    def _capture(self):
        import cv2

        api = self._backend()[0]
        if self.kind != "stream":
            return cv2.VideoCapture(self.target, api)
        ms = int(STREAM_TIMEOUT_S * 1000)
        return cv2.VideoCapture(self.target, api, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, ms,
                                                   cv2.CAP_PROP_READ_TIMEOUT_MSEC, ms])

    def open(self) -> None:
        import cv2

        backend = self._backend()[1]
        with opencv_quiet() as said:
            cap = self._capture()
            opened = cap.isOpened()
        if not opened:
            cap.release()
            reason = _library_reason(said).replace(str(self.target), self.name)
            if self.kind == "camera" and not reason and os.path.isdir("/dev") \
                    and not os.path.exists(f"/dev/video{self.target}"):
                reason = f"there is no /dev/video{self.target}"
            if self.kind == "stream":
                reason = "; ".join(filter(None, (reason, f"open timeout {STREAM_TIMEOUT_S:g} s")))
            raise SourceOpenError(f"cannot open {self.kind} {self.name!r} with {backend}"
                                  + (f" ({reason})" if reason else "") + f": {OPEN_ADVICE[self.kind]}")
        if self.kind == "video":
            count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
            self.frame_count = count if count > 0 else None
            if self.position:
                cap.set(cv2.CAP_PROP_POS_FRAMES, self.position)
        native = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        if self._fps_override is None and np.isfinite(native) and native > 0:
            self.fps = native
        self.cap = cap

    def read(self) -> Captured:
        if self.cap is None:
            raise StreamLost(f"{self.name}: not open")
        if not self.cap.grab():
            if self.kind != "video":
                raise StreamLost(f"{self.name}: no frame from the device")
            if self.frame_count is not None and self.position < self.frame_count \
                    and self._failed_at != self.position:
                self._failed_at = self.position
                raise StreamLost(f"{self.name}: read failed at frame {self.position} "
                                 f"of {self.frame_count}")
            raise EndOfStream(self.name)
        index = self.position if self.kind == "video" else None
        self.position += 1
        ok, image = self.cap.retrieve()
        where = f"{self.name} frame {index}" if index is not None else self.name
        return Captured(check_image(image if ok else None, where), index)

    def close(self) -> None:
        if self.cap is not None:
            self.cap.release()
            self.cap = None


@contextlib.contextmanager
def opencv_quiet():
    """OpenCV's own WARN / ERROR lines and FFmpeg's messages while a capture opens, kept off the
    console: the failure is reported once, as our one-line error, which quotes FFmpeg's reason.
    Yields the captured lines (fd-level capture only on the main thread, where it cannot swallow
    the capture thread's reports). OPENCV_LOG_LEVEL set by the user leaves everything as is."""

    lines: list[str] = []
    if os.environ.get("OPENCV_LOG_LEVEL"):
        yield lines
        return
    with opencv_log_silent():
        if threading.current_thread() is threading.main_thread():
            with stderr_lines() as lines:
                yield lines
        else:
            yield lines


@contextlib.contextmanager
def opencv_log_silent():
    """OpenCV's own log lines ([ WARN ] ...) off for the block, where the caller reports the
    outcome itself (a capture that does not open, a video frame that could not be written)."""
    import cv2

    logging = cv2.utils.logging
    level = logging.getLogLevel()
    logging.setLogLevel(logging.LOG_LEVEL_SILENT)
    try:
        yield
    finally:
        logging.setLogLevel(level)


def _library_reason(lines: list[str]) -> str:
    """The last FFmpeg message ("[mov,mp4 @ 0x..] moov atom not found" -> "moov atom not found")."""
    for line in reversed(lines):
        text = re.sub(r"^\[[^\]]*@ 0x[0-9a-f]+\]\s*", "", line.strip())
        if text and not text.startswith("[ WARN") and not text.startswith("[ERROR"):
            return text[:200]
    return ""


class FolderSource(Source):
    """The images of a folder (or a single image file), in name order."""

    def __init__(self, paths: list[Path], name: str, fps: float | None = None):
        self.paths = paths
        self.name = name
        self.fps = fps
        self.position = 0

    def open(self) -> None:
        pass

    def read(self) -> Captured:

        if self.position >= len(self.paths):
            raise EndOfStream(self.name)
        index, path = self.position, self.paths[self.position]
        self.position += 1
        return Captured(read_image(path), index, image_id=path.name)


class ACVRSource(Source):
    """ACVR sequence folder(s) with their ground-truth objects (edgecap.data.acvr)."""

    def __init__(self, root: Path, fps: float | None = None, area: str = "box"):
        self.name = str(root)
        self.fps = fps
        self.frames = list(load_sequences(root, area=area))
        self.position = 0

    def open(self) -> None:
        pass

    def read(self) -> Captured:

        if self.position >= len(self.frames):
            raise EndOfStream(self.name)
        index, frame = self.position, self.frames[self.position]
        self.position += 1
        if frame.rgb_path is None:
            raise BadFrame(f"{self.name}: frame {frame.image_id} has no RGB image")
        image = read_image(Path(frame.rgb_path))
        objects = [KnownObject(o.cls, tuple(float(v) for v in o.box), o.area, o.box_area, o.pixel_area)
                   for o in frame.foreground]
        return Captured(image, index, objects, image_id=frame.image_id)


def logged_image(msg, msgtype: str, log_ns: int) -> tuple[np.ndarray, LogStamp]:
    """A sensor_msgs Image / CompressedImage as (BGR frame, stamp): the log source and the ROS 2
    node convert every message with this. Raises edgecap.ros.images' ImageDecodeError (this
    message) or UnsupportedImage (the whole topic)."""
    from edgecap.ros.images import message_to_bgr, stamp_ns

    image = message_to_bgr(msg, msgtype)
    header = msg.header
    return image, LogStamp(stamp_ns(header.stamp), int(log_ns), str(header.frame_id))


class LogSource(Source):
    """One image topic of a robot log (edgecap.ros.logs): sensor_msgs/Image or CompressedImage.

    Frames keep their header stamp and log time, and are due at their recorded log time, so
    `--replay realtime` plays the log as the camera delivered it. A message that does not
    deserialize or decode is a bad frame (skipped, counted); an encoding the runtime cannot
    convert ends the run with one line naming it.
    """

    timed = True

    def __init__(self, path: Path, topic: str | None = None, fps: float | None = None):
        self.path = path
        self.name = str(path)
        self.wanted = topic
        self._fps_override = fps
        self.fps = fps
        self.log = None
        self.topic = None
        self.note: str | None = None
        self._messages = None
        self._first_log_ns: int | None = None
        self.position = 0

    def open(self) -> None:
        from edgecap.ros.logs import LogError, image_topic, open_log

        try:
            self.log = open_log(self.path)
            self.topic = image_topic(self.log, self.wanted)
        except LogError as exc:
            self.close()
            raise SourceOpenError(str(exc)) from None
        self.name = f"{self.path}:{self.topic.name}"
        self.note = self.log.note
        if self._fps_override is None:
            self.fps = self.topic.rate
        self._messages = self.log.messages(self.topic.name)

    def read(self) -> Captured:
        from edgecap.ros.images import ImageDecodeError, UnsupportedImage

        if self._messages is None:
            raise EndOfStream(self.name)
        try:
            log_ns, msg = next(self._messages)
        except StopIteration:
            raise EndOfStream(self.name) from None
        index = self.position
        self.position += 1
        where = f"{self.name} message {index}"
        if self._first_log_ns is None:
            self._first_log_ns = log_ns
        if msg is None:
            raise BadFrame(f"{where}: does not deserialize as {self.topic.msgtype}")
        try:
            image, stamp = logged_image(msg, self.topic.msgtype, log_ns)
        except ImageDecodeError as exc:
            raise BadFrame(f"{where}: {exc}") from None
        except UnsupportedImage as exc:
            raise SourceOpenError(f"source {self.name}: {exc}") from None
        return Captured(check_image(image, where), index, stamp=stamp,
                        due=(log_ns - self._first_log_ns) / 1e9)

    def close(self) -> None:
        if self._messages is not None:
            self._messages.close()  # leaves the reader's `with` blocks: files closed
            self._messages = None
        if self.log is not None:
            self.log.close()
            self.log = None


@dataclass
class SynthSpec:
    seed: int = 0
    size: int = 128
    fps: float = 15.0
    scene: float = 4.0          # seconds before the world moves to a new table


class SynthSource(Source):
    """The synthetic tabletop world rendered live: frame t is TabletopWorld.render_frame(t)."""

    def __init__(self, spec: SynthSpec, text: str, area: str = "box"):
        from edgecap.data.synth import TabletopWorld

        self.name = text
        self.fps = spec.fps
        self.world = TabletopWorld(spec.seed, spec.size, spec.fps, scene_seconds=spec.scene)
        self.area = area
        self.position = 0

    def open(self) -> None:
        pass

    def read(self) -> Captured:
        t = self.position
        self.position += 1
        image, objects = self.world.render_frame(t)
        known = world_objects(objects, image.shape[1], image.shape[0], self.area)
        return Captured(check_image(image, f"{self.name} frame {t}"), t, known)


def parse_synth(text: str) -> SynthSpec:
    parts = urlsplit(text)
    if parts.netloc != "tabletop" or parts.path not in ("", "/"):
        raise SourceOpenError(f"source {text!r}: unknown synthetic world; expected "
                              "synth://tabletop[?seed=S&size=N&fps=F&scene=SECONDS]")
    spec = SynthSpec()
    for key, values in parse_qs(parts.query, keep_blank_values=True).items():
        value = values[-1]
        caster = {"seed": int, "size": int, "fps": float, "scene": float}.get(key)
        if caster is None:
            raise SourceOpenError(f"source {text!r}: unknown parameter {key!r}; "
                                  "expected seed, size, fps or scene")
        try:
            parsed = caster(value)
        except ValueError:
            raise SourceOpenError(f"source {text!r}: {key}={value!r} is not a "
                                  f"{caster.__name__}") from None
        low = {"seed": 0, "size": 32, "fps": 1e-3, "scene": 1e-3}[key]
        if not parsed >= low or (key == "size" and parsed > 2048):
            raise SourceOpenError(f"source {text!r}: {key}={value} out of range")
        setattr(spec, key, parsed)
    return spec


def _is_acvr(path: Path) -> bool:
    if (path / "labels.json").is_file():
        return True
    return any(p.is_dir() and (p / "labels.json").is_file() for p in path.iterdir())


def make_source(spec: str, fps: float | None = None, topic: str | None = None, area: str = "box") -> Source:
    """Build (not open) the source a command-line string names. `fps` overrides the native rate;
    `topic` picks the image topic of a robot log; `area` is the coverage area (box or pixels)
    of the objects ACVR and synthetic-world sources know."""
    from edgecap.ros.logs import is_log

    text = str(spec).strip()
    if not text:
        raise SourceOpenError(f"empty source; expected {SOURCE_HELP}")
    path = Path(text).expanduser()
    if "://" not in text and is_log(path):
        return LogSource(path, topic, fps)
    if topic is not None:
        raise SourceOpenError(f"--topic {topic}: source {text!r} is not a robot log; --topic "
                              "applies to rosbag2 directories and .mcap / .db3 / .bag files")
    if re.fullmatch(r"\d+", text):
        return CaptureSource(int(text), "camera", fps)
    scheme = urlsplit(text).scheme.lower()
    if scheme == "synth":
        synth = parse_synth(text)
        if fps is not None:
            synth.fps = fps
        return SynthSource(synth, text, area)
    if scheme in STREAM_SCHEMES:
        return CaptureSource(text, "stream", fps)
    if path.is_dir():
        if _is_acvr(path):
            return ACVRSource(path, fps, area)
        images = folder_images(path)
        if not images:
            raise SourceOpenError(f"source {text!r}: {no_images_reason(path)}; no ACVR labels.json either")
        return FolderSource(images, text, fps)
    if path.is_file():
        if path.suffix.lower() in IMAGE_SUFFIXES:
            return FolderSource([path], text, fps)
        return CaptureSource(str(path), "video", fps)
    special = _special_file(path)
    if special == "camera":  # /dev/video0, or a /dev/v4l/by-id/... link to it
        return CaptureSource(text, "camera", fps)
    if special:
        raise SourceOpenError(f"source {text!r} is {special}; expected {SOURCE_HELP}")
    raise SourceOpenError(f"source {text!r}: no such file or directory; expected {SOURCE_HELP}")


V4L_MAJOR = 81  # Linux's video4linux character devices (/dev/videoN)


def _special_file(path: Path) -> str:
    """'camera' for a video4linux device; for any other file that is neither a regular file nor
    a directory (a FIFO, /dev/null), what it is and why it is no source; '' when nothing is there."""
    try:
        mode = path.stat()
    except OSError:
        return ""
    if stat.S_ISCHR(mode.st_mode):
        if os.major(mode.st_rdev) == V4L_MAJOR:
            return "camera"
        return "a character device, not a camera (a video4linux camera is /dev/videoN)"
    if stat.S_ISFIFO(mode.st_mode):
        return ("a named pipe (FIFO), which OpenCV cannot open as a video: write the stream to a file, or "
                "serve it as a URL (udp://, rtsp://)")
    kind = "a socket" if stat.S_ISSOCK(mode.st_mode) else "a block device" if stat.S_ISBLK(mode.st_mode) \
        else "a special file"
    return f"{kind}, not a camera, video, image or folder"


def source_identity(spec: str) -> str:
    """What a --source string names, whatever its spelling, so that one camera given twice is
    recognised: a file or folder by its resolved path (a trailing slash, `./`, a symbolic link),
    a camera index or its /dev/videoN device as `camera N`, synth:// by all its parameters
    (`synth://tabletop` is `synth://tabletop?seed=0`), a stream URL with its scheme and host in
    lower case. A string that names nothing (yet) is itself."""
    text = str(spec).strip()
    if re.fullmatch(r"\d+", text):
        return f"camera {int(text)}"
    if "://" in text:
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme == "synth":
            try:
                synth = parse_synth(text)
            except SourceOpenError:
                return text
            return f"synth://tabletop?seed={synth.seed}&size={synth.size}&fps={synth.fps:g}&scene={synth.scene:g}"
        netloc = parts.netloc.rpartition("@")
        return parts._replace(scheme=scheme, netloc=netloc[0] + netloc[1] + netloc[2].lower()).geturl()
    if not text:
        return text
    resolved = os.path.realpath(os.path.expanduser(text))
    device = re.fullmatch(r"/dev/video(\d+)", resolved)
    return f"camera {int(device.group(1))}" if device else resolved


def open_source(spec: str, fps: float | None = None, topic: str | None = None, area: str = "box") -> Source:
    source = make_source(spec, fps, topic, area)
    source.open()
    return source
