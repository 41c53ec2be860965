"""One log's images as rows: the Ray Data CPU task of a fleet job (no Ray imported here).

A log is read by the sources `edgecap run` reads it with (edgecap.runtime.sources: LogSource for
rosbag2, .mcap, .db3 and .bag; the video and image-folder sources), through a FrameGrabber at
pace "every", so frame numbers, stamps, skipped frames and a video's one reopen are exactly
those of `edgecap run --replay fast`. Each frame becomes a row holding the decoded BGR image;
after the log's last frame comes one "end" row saying how many frames each topic sent, what was
skipped, and why the log failed, if it did.

Nothing that goes wrong with one log escapes this task: a log that cannot be opened, an unknown
topic, a log damaged mid-way, an encoding the runtime cannot read, or any other error becomes
the end row's `error`, a named, counted failure of that log alone (the driver drops the rows the
log sent before it). A frame that does not decode is skipped and counted, as `edgecap run` does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import astuple, dataclass
from pathlib import Path

import numpy as np

from edgecap.contract.objects import KnownObject
from edgecap.data.coco_categories import load_categories
from edgecap.errors import EdgecapError

from .plan import LOG_FILE_SUFFIXES, VIDEO_SUFFIXES, stream_name

FRAME = "frame"
END = "end"
ROWS_PER_YIELD = 8          # rows handed to Ray per yield: small enough to stream, big enough to batch
SKIPS_KEPT = 3              # skip reasons kept per topic (all are counted)


def frame_schema():
    """The rows a read task yields (pyarrow schema)."""
    import pyarrow as pa

    return pa.schema([
        ("unit", pa.int64()),              # the log's position in the job's plan
        ("source", pa.string()),           # the log's path (the records' "source")
        ("topic", pa.string()),            # "" for a video or an image folder
        ("kind", pa.string()),             # FRAME or END
        ("index", pa.int64()),             # frame id: message index on the topic, frame or file number
        ("image", pa.binary()),            # HxWx3 uint8 BGR, row-major
        ("height", pa.int32()),
        ("width", pa.int32()),
        ("wall_time", pa.float64()),       # when the frame was read (time.time())
        ("header_ns", pa.int64()),
        ("log_ns", pa.int64()),
        ("header_frame_id", pa.string()),
        ("image_id", pa.string()),
        ("objects", pa.string()),          # JSON (encode_objects), null when none are known
        ("vocabulary", pa.string()),       # the objects' class set for coverage: null = ACVR's
        ("info", pa.string()),             # END rows: JSON, see read_log
    ])


@dataclass(frozen=True)
class ReadOptions:
    topics: tuple[str, ...] = ()       # empty: the log's only image topic
    all_topics: bool = False
    area: str = "box"
    detections: str | None = None      # folder of per-log detection files (plan.detection_file)
    categories: str | None = None      # COCO results: class names file (else COCO's 80)


def encode_objects(objects: list[KnownObject] | None) -> str | None:
    """Objects as JSON that decodes to equal KnownObjects (floats round-trip exactly)."""
    return None if objects is None else json.dumps([astuple(o) for o in objects])


def decode_objects(text: str | None) -> list[KnownObject] | None:
    if text is None:
        return None
    return [KnownObject(cls, tuple(box), area, box_area, pixel_area)
            for cls, box, area, box_area, pixel_area in json.loads(text)]


def read_logs(batch, options: ReadOptions) -> Iterator:
    """Ray Data's map_batches function: a batch of plan rows (unit, path, kind, key) in, the
    frame rows of each log out, a few at a time."""
    import pyarrow as pa

    schema = frame_schema()
    for unit in batch.to_pylist():
        rows: list[dict] = []
        for row in read_log(unit, options):
            rows.append(row)
            if len(rows) >= ROWS_PER_YIELD or row["kind"] == END:
                yield pa.Table.from_pylist(rows, schema=schema)
                rows = []


def read_log(unit: dict, options: ReadOptions) -> Iterator[dict]:
    """The frame rows of one log, then its END row, whose info is
    {"source", "streams": [{"topic", "frames", "skipped", "skips", "note", "detections"}], "error"}."""
    streams: list[dict] = []
    error = None
    try:
        for topic, source, only in _sources(unit, options):
            stream = {"topic": topic, "frames": 0, "skipped": 0, "skips": [], "note": None, "detections": None}
            streams.append(stream)
            yield from _frames(unit, topic, source, only, stream, options)
        if streams and not any(s["frames"] for s in streams):
            skipped = sum(s["skipped"] for s in streams)
            first = next((s["skips"][0] for s in streams if s["skips"]), "")
            error = (f"no image could be read ({skipped} skipped{': ' + first if first else ''})" if skipped
                     else "no images")
    except EdgecapError as exc:
        error = str(exc)
    except Exception as exc:  # one log's unforeseen failure must not stop the fleet: named, counted
        error = f"{type(exc).__name__}: {exc}"
    yield {"unit": unit["unit"], "topic": "", "kind": END, "index": -1,
           "info": json.dumps({"source": unit["path"], "streams": streams, "error": error})}


def image_topics(path: str, options: ReadOptions) -> list[str]:
    """The topics of a log to caption, as `edgecap run --topic` chooses them: the named ones,
    every image topic (--all-topics), or the only one (an error listing them when there are
    several). LogError (one line) when the log cannot be opened or lacks a named topic."""
    from edgecap.ros.images import IMAGE_TYPES
    from edgecap.ros.logs import image_topic, open_log

    with open_log(path) as log:
        if options.all_topics:
            names = sorted(t.name for t in log.topics.values() if t.msgtype in IMAGE_TYPES)
            if not names:
                image_topic(log, None)  # raises: no image topics, listing the log's topics
            return names
        if not options.topics:
            return [image_topic(log, None, "--topic or --all-topics").name]
        return [image_topic(log, name).name for name in options.topics]


def _sources(unit: dict, options: ReadOptions):
    """(topic, unopened source, whether it is the log's only stream) per stream of the log."""
    from edgecap.runtime.sources import make_source

    path = unit["path"]
    if unit["kind"] == "log":
        topics = image_topics(path, options)
        for topic in topics:
            yield topic, make_source(path, topic=topic, area=options.area), len(topics) == 1
    else:
        yield "", make_source(path, area=options.area), True


def _frames(unit: dict, topic: str, source, only: bool, stream: dict, options: ReadOptions) -> Iterator[dict]:
    from edgecap.runtime.camera import FrameGrabber
    from edgecap.runtime.sources import FolderSource

    detections, vocabulary = _detections(unit["key"], topic, only, options, stream)

    def skipped(message: str) -> None:
        if message.startswith("skipped: ") and len(stream["skips"]) < SKIPS_KEPT:
            stream["skips"].append(message.removeprefix("skipped: "))

    source.open()  # SourceOpenError: one line, the log fails
    stream["note"] = getattr(source, "note", None)
    if detections is not None and isinstance(source, FolderSource):
        detections.check_folder(source.paths, source.name)
    grabber = FrameGrabber(source, pace="every", log=skipped)
    try:
        grabber.start()
        while True:
            frame = grabber.get(timeout=0.1)
            if frame is None:
                if grabber.finished:
                    break
                continue
            height, width = frame.image.shape[:2]
            objects = frame.objects
            if detections is not None:  # --detections replaces the source's own objects
                objects = detections.objects(frame.frame_id, width, height,
                                             frame.image_id if isinstance(source, FolderSource) else None)
            stamp = frame.stamp
            stream["frames"] += 1
            yield {"unit": unit["unit"], "source": unit["path"], "topic": topic, "kind": FRAME, "index": frame.frame_id,
                   "image": np.ascontiguousarray(frame.image).tobytes(), "height": height, "width": width,
                   "wall_time": frame.wall_time,
                   "header_ns": stamp.header_ns if stamp else None, "log_ns": stamp.log_ns if stamp else None,
                   "header_frame_id": stamp.frame_id if stamp else None, "image_id": frame.image_id,
                   "objects": encode_objects(objects), "vocabulary": vocabulary if objects is not None else None}
    finally:
        grabber.close()
        stream["skipped"] = grabber.stats.skipped
    if grabber.error is not None:
        raise grabber.error


def detection_file(folder: str, key: str, topic: str, single: bool) -> Path | None:
    """A log's detections in `folder`, named after its key without the log's suffix
    (robot1/run1.mcap -> FOLDER/robot1/run1): `<that>.<topic>.jsonl` (or .json, COCO results) for
    one of its topics, or `<that>.jsonl` when the log is captioned on one stream only."""
    base = Path(folder) / key
    if base.suffix.lower() in LOG_FILE_SUFFIXES + VIDEO_SUFFIXES:
        base = base.with_suffix("")
    names = [f"{base.name}.{stream_name(topic)}{suffix}" for suffix in (".jsonl", ".json")] if topic else []
    if single or not topic:
        names += [f"{base.name}{suffix}" for suffix in (".jsonl", ".json")]
    return next((base.parent / n for n in names if (base.parent / n).is_file()), None)


def _detections(key: str, topic: str, only: bool, options: ReadOptions, stream: dict):
    """(Detections or None, the coverage vocabulary spec of their class set or None)."""
    if options.detections is None:
        return None, None
    from edgecap.runtime.detections import Detections

    path = detection_file(options.detections, key, topic, only)
    if path is None:
        return None, None
    categories = None
    if options.categories:
        categories = load_categories(options.categories)
    detections = Detections(path, options.area, categories=categories)
    stream["detections"] = str(path)
    return detections, (options.categories or "coco") if detections.coco else None
