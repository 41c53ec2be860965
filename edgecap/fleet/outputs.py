"""The driver side of a fleet job: caption rows gathered per log, and a finished log's outputs.

Rows reach the driver in whatever order Ray Data's actors finish them. `Gatherer` keeps each
log's rows by (topic, frame index), dropping repeats (a read task that Ray retried sends its
frames again), until the log's END row has come and every frame it announced is there; a log
whose END row carries an error is done at once, as a failure, and its late rows are ignored.

A finished log is written in this order, each file atomically (a work directory beside it,
renamed into place when complete):

    1. one caption log per topic (OUT/captions/<key>/<topic>.mcap), the messages `edgecap run
       --out-mcap` writes, stamped like the images;
    2. its dataset part (OUT/dataset/<key>.parquet), whose Parquet metadata names the job's
       settings and each caption log with its caption count.

So a log is finished exactly when its part exists, carries this job's settings, and each caption
log it names is there with that many captions (`finished`): a job killed at any moment is
resumed by skipping those and captioning the rest, and nothing depends on file times.

The dataset (DATASET_COLUMNS, docs/fleet.md) is every part under OUT/dataset, read as one
table by `pyarrow.dataset.dataset(OUT / "dataset")` (the work directories start with a dot,
which readers skip). Rows are sorted by topic and frame index, so a log captioned again gives
the same part.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from edgecap.io import WORK_SUFFIX, atomic_path, check_file_target, remove_orphans

from .plan import JobSettings, Layout, LogInput, settings_fingerprint
from .reading import END, decode_objects

PART_METADATA = b"edgecap.fleet"

# name, what it holds (docs/fleet.md lists the same)
DATASET_COLUMNS = (
    ("log", "the log's path"),
    ("log_key", "the log's name in --out (its path under the LOGS folder it was found in)"),
    ("topic", "image topic; null for a video or an image folder"),
    ("frame_index", "the frame's position: message index on the topic, video frame, file in name order"),
    ("header_stamp_ns", "the image's header stamp (robot logs)"),
    ("log_time_ns", "when the recorder logged it (robot logs)"),
    ("header_frame_id", "the image header's frame_id (robot logs)"),
    ("image_id", "image folders: the file name; ACVR: sequence/frame"),
    ("caption", "the caption"),
    ("tokens", "its word ids"),
    ("beam", "the beam it was decoded with"),
    ("beam_score", "its summed log-probability"),
    ("coverage", "{'>1%': .., '>3%': .., '>5%': .., '>10%': ..}, when objects were known and scored"),
    ("objects", "the known objects (class, box, area, box_area, pixel_area)"),
    ("mentioned", "the objects the caption names, by coverage's matching (noun, class, profit, exact)"),
    ("bundle_sha256", "sha256 of the bundle's manifest.json (which pins every graph's sha256)"),
    ("edgecap_version", "the edgecap that captioned it"),
)


def dataset_schema():
    import pyarrow as pa

    obj = pa.struct([("class", pa.string()), ("box", pa.list_(pa.float64())), ("area", pa.float64()),
                     ("box_area", pa.float64()), ("pixel_area", pa.float64())])
    match = pa.struct([("noun", pa.string()), ("class", pa.string()), ("profit", pa.float64()),
                       ("exact", pa.bool_())])
    types = {"log": pa.string(), "log_key": pa.string(), "topic": pa.string(), "frame_index": pa.int64(),
             "header_stamp_ns": pa.int64(), "log_time_ns": pa.int64(), "header_frame_id": pa.string(),
             "image_id": pa.string(), "caption": pa.string(), "tokens": pa.list_(pa.int32()),
             "beam": pa.int32(), "beam_score": pa.float64(), "coverage": pa.map_(pa.string(), pa.float64()),
             "objects": pa.list_(obj), "mentioned": pa.list_(match), "bundle_sha256": pa.string(),
             "edgecap_version": pa.string()}
    return pa.schema([(name, types[name]) for name, _ in DATASET_COLUMNS])


@dataclass
class LogRows:
    """What the driver has of one log so far."""

    unit: int
    log: LogInput
    rows: dict[tuple[str, int], dict] = field(default_factory=dict)
    end: dict | None = None                      # the END row's info

    @property
    def error(self) -> str | None:
        return None if self.end is None else self.end["error"]

    @property
    def done(self) -> bool:
        if self.end is None:
            return False
        if self.error is not None:
            return True
        received: dict[str, int] = {}
        for topic, _ in self.rows:
            received[topic] = received.get(topic, 0) + 1
        return all(received.get(s["topic"], 0) == s["frames"] for s in self.end["streams"])

    def stream_rows(self, topic: str) -> list[dict]:
        return [self.rows[k] for k in sorted(k for k in self.rows if k[0] == topic)]


class Gatherer:
    """`add(table)` -> the logs its rows completed (finished or failed), each once."""

    def __init__(self, logs: dict[int, LogInput]):
        self.open = {unit: LogRows(unit, log) for unit, log in logs.items()}

    def add(self, table) -> list[LogRows]:
        touched = {}
        for row in table.to_pylist():
            state = self.open.get(row["unit"])
            if state is None:  # a failed log's late rows, or a repeat of a finished log's
                continue
            if row["kind"] == END:
                state.end = json.loads(row["info"])
            else:
                state.rows.setdefault((row["topic"], row["index"]), row)
            touched[state.unit] = state
        done = [state for state in touched.values() if state.done]
        for state in done:
            del self.open[state.unit]
        return done


def write_log(layout: Layout, state: LogRows, settings: JobSettings, bundle: str) -> int:
    """Write a finished log's caption logs, then its dataset part; -> captions written."""
    from edgecap.runtime.mcap_sink import McapCaptionSink

    logs: dict[str, int] = {}
    tables = []
    for stream in state.end["streams"]:
        rows = state.stream_rows(stream["topic"])
        if not rows:
            continue
        path = layout.caption_log(state.log.key, stream["topic"])
        path.parent.mkdir(parents=True, exist_ok=True)
        sink = McapCaptionSink(path, source=state.log.path, bundle=bundle)
        try:
            for row in rows:
                log_ns, messages = json.loads(row["messages"])
                sink.write_messages(log_ns, [tuple(m) for m in messages])
        except BaseException:
            sink.writer.abort()
            raise
        sink.close()
        logs[str(path.relative_to(layout.root))] = len(rows)
        tables.append(_dataset_rows(state.log, rows, settings))
    _write_part(layout, state.log, tables, settings, logs)
    return sum(logs.values())


def _dataset_rows(log: LogInput, rows: list[dict], settings: JobSettings) -> list[dict]:
    out = []
    for row in rows:
        objects = decode_objects(row["objects"])
        coverage = None if row["coverage"] is None else json.loads(row["coverage"])
        out.append({
            "log": log.path, "log_key": log.key, "topic": row["topic"] or None, "frame_index": row["index"],
            "header_stamp_ns": row["header_ns"], "log_time_ns": row["log_ns"],
            "header_frame_id": row["header_frame_id"], "image_id": row["image_id"],
            "caption": row["caption"], "tokens": row["tokens"], "beam": row["beam"], "beam_score": row["score"],
            "coverage": None if coverage is None else list(coverage.items()),
            "objects": None if objects is None else [
                {"class": o.cls, "box": list(o.box), "area": o.area, "box_area": o.box_area,
                 "pixel_area": o.pixel_area} for o in objects],
            "mentioned": None if row["mentioned"] is None else json.loads(row["mentioned"]),
            "bundle_sha256": settings.bundle_sha256, "edgecap_version": settings.edgecap_version})
    return out


def _write_part(layout: Layout, log: LogInput, tables: list[list[dict]], settings: JobSettings,
                caption_logs: dict[str, int]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = layout.part(log.key)
    part.parent.mkdir(parents=True, exist_ok=True)
    check_file_target(part, _part_metadata_ok, "a dataset part written by edgecap fleet", "--out")
    meta = {"settings": settings_fingerprint(settings), "log": log.path, "key": log.key,
            "caption_logs": caption_logs}
    schema = dataset_schema().with_metadata({PART_METADATA: json.dumps(meta).encode()})
    table = pa.Table.from_pylist([row for rows in tables for row in rows], schema=schema)
    with atomic_path(part, flag="--out") as tmp:
        pq.write_table(table, tmp, compression="zstd")


def _part_metadata(path: Path) -> dict | None:
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
        return json.loads(meta[PART_METADATA])
    except Exception:  # not Parquet (pyarrow's ArrowInvalid), not ours (KeyError), not JSON: not a finished part
        return None


def _part_metadata_ok(path: Path) -> bool:
    return _part_metadata(path) is not None


def finished(layout: Layout, log: LogInput, settings: JobSettings) -> bool:
    """True when `log`'s part and caption logs are complete and made with `settings`."""
    part = layout.part(log.key)
    if not part.is_file():
        return False
    meta = _part_metadata(part)
    if meta is None or meta.get("settings") != settings_fingerprint(settings) or meta.get("log") != log.path:
        return False
    return all(caption_count(layout.root / name) == count for name, count in meta.get("caption_logs", {}).items())


def caption_count(path: Path) -> int | None:
    """Captions in a finished caption log (from its summary), None when it is missing or not one."""
    from mcap.exceptions import McapError
    from mcap.reader import make_reader

    from edgecap.ros.captions import CAPTION_TOPIC

    try:
        with path.open("rb") as fh:
            summary = make_reader(fh).get_summary()
    except (OSError, McapError, ValueError, EOFError, KeyError, StopIteration):
        return None
    if summary is None or summary.statistics is None:
        return None
    ids = [c.id for c in summary.channels.values() if c.topic == CAPTION_TOPIC]
    return sum(summary.statistics.channel_message_counts.get(i, 0) for i in ids)


def remove_orphans_under(root: Path) -> list[Path]:
    """Remove the work directories a killed job left under `root` (edgecap.io's rule: only those
    whose writer is dead). A job killed between renaming a file into place and removing its work
    directory leaves one beside a finished file, which no later write of that file would clear."""
    removed = []
    for work in sorted(root.rglob(f".*{WORK_SUFFIX}")):
        if work.is_dir() and work.parent.exists():
            # .<target name>.<random>.edgecap-tmp
            removed += remove_orphans(work.parent / work.name[1:].removesuffix(WORK_SUFFIX).rsplit(".", 1)[0])
    return removed

