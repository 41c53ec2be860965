"""Which logs a fleet job captions, the name each one's outputs go by, and the output folder.

LOGS arguments, each one of:

    a robot log         rosbag2 directory (SQLite3 or MCAP storage), .mcap, .db3 or ROS 1 .bag
    a video file        .mp4, .m4v, .mov, .avi, .mkv, .webm
    an image folder     a folder holding images, or an ACVR sequence folder (given directly)
    a folder of those   searched recursively for robot logs and videos

A folder is one rosbag2 recording when it has metadata.yaml, or, for a recording killed before
it wrote one, when its storage files are named as rosbag2 names them (`<folder>_0.mcap`, ...);
any other folder of .mcap / .db3 / .bag files is a folder of separate logs.

Every log gets a key, its path relative to the folder argument it was found in, under that
folder's name (`robot1/2026-11-20/run3.mcap`), or its own name when given directly. Its outputs
are named after the key, so the same log always lands on the same files and a second run finds
what the first one finished:

    OUT/fleet.json                      the job's settings (bundle sha256, topics, ...)
    OUT/captions/<key>/<topic>.mcap     one caption log per captioned topic, as `edgecap run
                                        --out-mcap` writes it (<topic>: /a/b -> a__b)
    OUT/dataset/<key>.parquet           the log's part of the caption dataset, written last
    OUT/summary.json                    what the latest run did
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from edgecap.errors import EdgecapError
from edgecap.io import probe_writable, write_json_atomic
from edgecap.jsonio import json_or_none

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm")
LOG_FILE_SUFFIXES = (".mcap", ".db3", ".bag")
JOB_FILE = "fleet.json"
FRAMES_STREAM = "frames"          # the caption log's name for a video or an image folder


@dataclass(frozen=True)
class LogInput:
    """One log of the job: where it is, what it is, and the key its outputs are named by."""

    path: str                     # absolute
    key: str                      # relative, '/'-separated, unique in the job
    kind: str                     # "log", "video" or "images"


def discover(arguments: list[str], out: Path) -> list[LogInput]:
    """The logs the LOGS arguments name, sorted by key; one line naming the argument when one
    names nothing edgecap reads, and when two logs would share a key."""
    from edgecap.runtime.sources import IMAGE_SUFFIXES, folder_images

    found: list[LogInput] = []
    out = out.resolve()
    for text in arguments:
        path = Path(text).expanduser()
        if not path.exists():
            raise EdgecapError(f"LOGS {text}: no such file or directory")
        path = path.resolve()
        if path == out or out in path.parents:
            raise EdgecapError(f"LOGS {text} is inside --out {out}; give the logs, not the outputs")
        if path.is_file():
            kind = _file_kind(path)
            if kind is None and path.suffix.lower() in IMAGE_SUFFIXES:
                kind = "images"
            if kind is None:
                raise EdgecapError(f"LOGS {text}: not a robot log ({', '.join(LOG_FILE_SUFFIXES)}, a rosbag2 "
                                   f"directory), a video ({', '.join(VIDEO_SUFFIXES)}) or an image")
            found.append(LogInput(str(path), path.name, kind))
        elif _is_recording(path):
            found.append(LogInput(str(path), path.name, "log"))
        elif _is_acvr(path) or folder_images(path):
            found.append(LogInput(str(path), path.name, "images"))
        else:
            inside = list(_search(path, path.name, out))
            if not inside:
                raise EdgecapError(f"LOGS {text}: no robot logs ({', '.join(LOG_FILE_SUFFIXES)}, rosbag2 "
                                   f"directories) or videos ({', '.join(VIDEO_SUFFIXES)}) in it")
            found += inside
    keys: dict[str, str] = {}
    unique: dict[str, LogInput] = {}
    for log in found:
        if log.key in keys and keys[log.key] != log.path:
            raise EdgecapError(f"LOGS: {keys[log.key]} and {log.path} would both be named {log.key!r} in --out; "
                               "give their parent folders instead, so their names differ")
        keys[log.key] = log.path
        unique.setdefault(log.path, log)  # a log named twice (directly and in its folder) once, by its first name
    return sorted(unique.values(), key=lambda log: log.key)


def _file_kind(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix in LOG_FILE_SUFFIXES:
        return "log"
    return "video" if suffix in VIDEO_SUFFIXES else None


def _is_recording(path: Path) -> bool:
    """A rosbag2 directory: metadata.yaml, or only storage files named <folder>_N.<ext>[.zstd]
    (a recording killed before it wrote its metadata)."""
    if (path / "metadata.yaml").is_file():
        return True
    pattern = re.compile(re.escape(path.name) + r"_\d+\.(mcap|db3)(\.zstd)?", re.IGNORECASE)
    storage = [p.name for p in path.iterdir() if p.is_file() and re.search(r"\.(mcap|db3)(\.zstd)?$", p.name, re.I)]
    return bool(storage) and all(pattern.fullmatch(name) for name in storage)


def _is_acvr(path: Path) -> bool:
    return (path / "labels.json").is_file() or any(
        p.is_dir() and (p / "labels.json").is_file() for p in path.iterdir())


def _search(folder: Path, key: str, out: Path):
    """Robot logs and videos below `folder` (hidden names and --out skipped), keys under `key`."""
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".") or child.resolve() == out:
            continue
        child_key = f"{key}/{child.name}"
        if child.is_dir():
            if _is_recording(child):
                yield LogInput(str(child.resolve()), child_key, "log")
            else:
                yield from _search(child, child_key, out)
        elif child.is_file() and _file_kind(child) is not None:
            yield LogInput(str(child.resolve()), child_key, _file_kind(child))


def stream_name(topic: str | None) -> str:
    """The file name (without .mcap) of a topic's caption log: /camera/image_raw -> camera__image_raw."""
    if not topic:
        return FRAMES_STREAM
    return "__".join(part for part in topic.split("/") if part) or FRAMES_STREAM


@dataclass(frozen=True)
class Layout:
    """Where a job's outputs go under --out."""

    root: Path

    def caption_log(self, key: str, topic: str | None) -> Path:
        return self.root / "captions" / key / f"{stream_name(topic)}.mcap"

    def part(self, key: str) -> Path:
        return self.root / "dataset" / f"{key}.parquet"

    @property
    def dataset(self) -> Path:
        return self.root / "dataset"

    @property
    def job_file(self) -> Path:
        return self.root / JOB_FILE

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"


@dataclass(frozen=True)
class JobSettings:
    """What decides a job's captions: a finished log is reused only by a run with the same."""

    bundle_sha256: str
    beam: int
    topics: tuple[str, ...]           # empty: the log's only image topic
    all_topics: bool
    detections: str | None            # folder of per-log detection files
    categories: str | None
    area: str
    coverage: bool
    edgecap_version: str

    def to_json(self) -> dict:
        return {**asdict(self), "topics": list(self.topics)}


def open_out(layout: Layout, settings: JobSettings) -> bool:
    """Make --out ready for `settings`: a new or empty folder becomes a fleet output (True); a
    fleet output of the same settings is resumed (False). A folder that is not a fleet output,
    or one made with other settings, is refused in one line naming the difference."""
    root = layout.root
    if root.exists() and not root.is_dir():
        raise EdgecapError(f"--out {root} exists and is not a directory")
    if root.is_dir() and any(root.iterdir()):
        earlier = json_or_none(layout.job_file)
        if not isinstance(earlier, dict) or earlier.get("kind") != "edgecap fleet":
            raise EdgecapError(f"--out {root} is not empty and holds no {JOB_FILE} of edgecap fleet; not writing "
                               "into it (choose a new or empty folder)")
        wanted = settings.to_json()
        for name, value in wanted.items():
            if earlier.get("settings", {}).get(name) != value:
                raise EdgecapError(f"--out {root} holds a job made with {name} = "
                                   f"{earlier.get('settings', {}).get(name)!r}; this run has {value!r} (use the "
                                   "same settings to resume it, or choose another --out)")
        probe_writable(root)
        return False
    probe_writable(root)
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(layout.job_file, {"kind": "edgecap fleet", "settings": settings.to_json()})
    return True


def settings_fingerprint(settings: JobSettings) -> str:
    """The settings as one canonical string (stored in every dataset part)."""
    return json.dumps(settings.to_json(), sort_keys=True)
