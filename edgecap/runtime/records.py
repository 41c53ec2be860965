"""Caption records, the JSONL sink and the run summary.

One record per captioned frame:

    {"frame_id", "image_id"?, "source", "t_capture", "wall_time", "caption", "tokens", "beam",
     "latency_ms": {"preprocess", "visual", "encoder", "decode", "detector"?}, "capture_to_caption_ms",
     "header_stamp_ns"?, "log_time_ns"?, "header_frame_id"? (robot logs),
     "objects"?: [{"class", "box", "area", "box_area", "pixel_area"?}],
     "coverage"?: {">1%": .., ">3%": .., ">5%": .., ">10%": ..}, "mentioned"?}

The JSONL sink writes one whole line per record and flushes it, so a run that is interrupted
(Ctrl-C, SIGTERM, a crash) leaves every finished record on disk as valid JSON Lines, readable
by `edgecap eval coverage --captions FILE.jsonl` (image_id / source + frame_id keys) and, with
the objects, re-scored by `edgecap eval coverage --records FILE.jsonl` (`read_runs`).
With `--append` each run adds to the file between a {"kind": "run_start", ...} line and a
{"kind": "run_end", <summary>} line (absent when the process was killed).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from edgecap import __version__
from edgecap.contract.runlog import RUN_END, RUN_START, summary_path

from .camera import Frame, GrabberStats
from .captioner import STAGES, Caption
from .histogram import LogHistogram


@dataclass
class Record:
    frame: Frame
    caption: Caption
    source: str
    t_done: float                                 # time.monotonic() when the caption was ready
    coverage: dict[str, float | None] | None = None
    matches: list[dict] | None = None             # coverage matches at the lowest threshold
    camera: int | None = None                     # which camera (--source order), in a run of several

    def stamps_ns(self) -> tuple[int, int]:
        """(header stamp, log time) of the captioned image: a logged image's own, else the
        capture wall time for both. Caption logs (MCAP, rerun) are stamped with these."""
        if self.frame.stamp is not None:
            return self.frame.stamp.header_ns, self.frame.stamp.log_ns
        wall = int(round(self.frame.wall_time * 1e9))
        return wall, wall

    @property
    def capture_to_caption_ms(self) -> float:
        return (self.t_done - self.frame.t_capture) * 1e3

    def to_json(self) -> dict:
        f, c = self.frame, self.caption
        out: dict = {"frame_id": f.frame_id}
        if f.image_id is not None:
            out["image_id"] = f.image_id
        if self.camera is not None:
            out["camera"] = self.camera
        out.update({
            "source": self.source,
            "t_capture": round(f.t_capture, 6),
            "wall_time": round(f.wall_time, 6),
            "caption": c.text,
            "tokens": list(c.tokens),
            "beam": c.beam,
            # the caption's stages, then any stage beside it (a --detector's "detector")
            "latency_ms": {s: round(c.latency_ms.get(s, 0.0), 3) for s in (*STAGES, *sorted(set(c.latency_ms) - set(STAGES)))},
            "capture_to_caption_ms": round(self.capture_to_caption_ms, 3),
        })
        if f.stamp is not None:
            out.update(f.stamp.to_json())
        if f.objects is not None:
            out["objects"] = [o.to_json() for o in f.objects]
        if self.coverage is not None:
            out["coverage"] = {k: (None if v is None else round(v, 6)) for k, v in self.coverage.items()}
            out["mentioned"] = self.matches or []
        return out

    def human(self) -> str:
        c = self.caption
        parts = [f"[{self.frame.frame_id:>6}]" if self.camera is None
                 else f"[cam{self.camera} {self.frame.frame_id:>6}]", f"{self.capture_to_caption_ms:7.1f} ms",
                 f"beam {c.beam}", c.text or "(empty caption)"]
        if self.coverage is not None:
            cells = [f"{k}={'-' if v is None else f'{100 * v:.0f}%'}" for k, v in self.coverage.items()]
            parts.append("| coverage " + " ".join(cells))
        return "  ".join(parts)


class JsonlWriter:
    """Writes one JSON line per record and flushes it; `close()` is idempotent.

    `append` keeps what the file holds (a service restarted after a camera loss must not wipe
    its history) and starts on a fresh line if the previous process died mid-line.
    """

    def __init__(self, path: str | os.PathLike, append: bool = False):
        from edgecap.io import WorkDir

        self.path = Path(path)
        # the file is written in place (a killed run keeps its records), so the claim on it is
        # a work directory beside it: a second writer is refused before it truncates anything
        self._claim = WorkDir(self.path, "--jsonl", exclusive=True)
        try:
            self._fh = self.path.open("a" if append else "w", encoding="utf-8")
        except BaseException:
            self._claim.close()
            raise
        if append and self._fh.tell() > 0 and not _ends_with_newline(self.path):
            self._fh.write("\n")
        self.count = 0

    def write(self, obj: dict) -> None:
        self._fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self._fh.flush()
        self.count += 1

    def close(self) -> None:
        try:
            if not self._fh.closed:
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._fh.close()
        finally:
            self._claim.close()


def check_jsonl_target(path: str | os.PathLike, append: bool) -> None:
    """Refuse (one line) a --jsonl FILE, or the FILE.summary.json beside it, that exists and is
    not what `edgecap run` writes: replacing or appending to it would spoil someone's file."""
    from edgecap.io import check_file_target, json_file_with

    check_file_target(path, _is_caption_log, "a caption log written by edgecap run", "--jsonl",
                      "appending to" if append else "overwriting")
    check_file_target(summary_path(path), json_file_with("frames_captioned", "stopped_by"),
                      "a run summary written by edgecap run", f"--jsonl {path}: its summary file")


def _is_caption_log(path: Path) -> bool:
    """Empty, or its first line is a caption record or a run marker (what JsonlWriter writes;
    any JSON object with a "caption" counts, so captions from elsewhere can be appended to)."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(1 << 20)
            rest = fh.read(1)
        if not first.strip():
            return not rest  # nothing in it to lose
        line = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(line, dict) and ("caption" in line or line.get("kind") in (RUN_START, RUN_END))


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def run_start_record(source: str, bundle: str | None, coverage_area: str = "box") -> dict:
    """The line that opens each run in an appended JSONL (`kind` marks it as no caption); it
    names the coverage rule too, so a run killed before its run_end still says how it scored."""
    return {"kind": RUN_START, "wall_time": round(time.time(), 6), "source": source,
            "bundle": bundle, "pid": os.getpid(), "edgecap": __version__,
            "coverage_rule": coverage_rule(coverage_area)}


def coverage_rule(area: str) -> str:
    """How a run decides that an object is in view at a threshold (run_start, the summary)."""
    return f"{area} area > threshold"


@dataclass
class Summary:
    """What a run did, printed at exit (and written beside the JSONL)."""

    source: str
    started: float = field(default_factory=time.monotonic)
    first_caption: float | None = None
    last_caption: float | None = None
    captioned: int = 0
    # bounded whatever the run's length (a robot runs for weeks): latencies in a histogram,
    # coverage as running sums and counts per threshold
    latencies: LogHistogram = field(default_factory=LogHistogram)
    coverage_sums: dict[str, float] = field(default_factory=dict)
    coverage_counts: dict[str, int] = field(default_factory=dict)
    beams: dict[int, int] = field(default_factory=dict)
    grabber: GrabberStats | None = None
    stopped_by: str = "end of source"
    beam_changes: int = 0
    coverage_area: str = "box"                    # what an object's area is (--area)
    detections: dict | None = None                # the --detections file's ids, matched or not
    detector: dict | None = None                  # the --detector that gave the objects
    cameras: list[Summary] | None = None          # several sources: each camera's own summary
    camera: int | None = None                     # a camera's own summary: its --source position
    stalls: int = 0                               # times a camera published nothing for a while
    rounds: int = 0                               # several sources: batches captioned
    coverage_unscored: int = 0                    # captions finished while the scorer was loading

    def add(self, record: Record) -> None:
        self.captioned += 1
        self.latencies.add(record.capture_to_caption_ms)
        if self.first_caption is None:
            self.first_caption = record.t_done
        self.last_caption = record.t_done
        self.beams[record.caption.beam] = self.beams.get(record.caption.beam, 0) + 1
        for key, value in (record.coverage or {}).items():
            if value is not None:
                self.coverage_sums[key] = self.coverage_sums.get(key, 0.0) + value
                self.coverage_counts[key] = self.coverage_counts.get(key, 0) + 1

    @property
    def fps(self) -> float | None:
        # n captions finished over n - 1 intervals between the first and the last one
        if self.captioned < 2 or self.first_caption is None or self.last_caption is None:
            return None
        span = self.last_caption - self.first_caption
        return (self.captioned - 1) / span if span > 0 else None

    def to_json(self) -> dict:
        g = self.grabber or GrabberStats.total(c.grabber for c in self.cameras or [] if c.grabber is not None)
        return {
            **({"camera": self.camera} if self.camera is not None else {}),
            "source": self.source,
            "stopped_by": self.stopped_by,
            "frames_captured": g.captured,
            "frames_captioned": self.captioned,
            "frames_dropped": g.dropped,
            "frames_skipped": g.skipped,
            "reopens": g.reopens,
            "fps": None if self.fps is None else round(self.fps, 3),
            "capture_to_caption_ms": {
                f"p{q}": (None if (v := self.latencies.percentile(q)) is None else round(v, 3))
                for q in (50, 95, 99)},
            "beams": {str(k): v for k, v in sorted(self.beams.items())},
            "beam_changes": self.beam_changes,
            "coverage_mean": {k: round(self.coverage_sums[k] / n, 6) for k, n in self.coverage_counts.items()},
            "coverage_frames": dict(self.coverage_counts),
            "coverage_rule": coverage_rule(self.coverage_area),
            **({"coverage_unscored": self.coverage_unscored} if self.coverage_unscored else {}),
            **({"detections": self.detections} if self.detections is not None else {}),
            **({"detector": self.detector} if self.detector is not None else {}),
            **({"stalls": self.stalls} if self.camera is not None else {}),
            **({"rounds": self.rounds, "cameras": [c.to_json() for c in self.cameras]}
               if self.cameras is not None else {}),
        }

    def human(self) -> str:
        s = self.to_json()
        lat = s["capture_to_caption_ms"]

        def ms(v, fmt=".1f"):
            return "-" if v is None else format(v, fmt)

        lines = [
            f"summary: {s['frames_captioned']} frames captioned, {s['frames_dropped']} dropped, "
            f"{s['frames_skipped']} skipped (undecodable), {s['reopens']} reopens; "
            f"stopped by {s['stopped_by']}",
            f"  {ms(s['fps'], '.2f')} captions/s; capture-to-caption "
            f"p50 {ms(lat['p50'])} ms, p95 {ms(lat['p95'])} ms, p99 {ms(lat['p99'])} ms",
        ]
        if s["coverage_mean"]:
            cells = [f"{k} {100 * v:.1f} (n={s['coverage_frames'][k]})"
                     for k, v in s["coverage_mean"].items()]
            lines.append(f"  mean coverage ({s['coverage_rule']}): " + ", ".join(cells))
        if s.get("coverage_unscored"):
            lines.append(f"  {s['coverage_unscored']} captions not scored: finished while the coverage scorer "
                         "was loading (--coverage-load background)")
        for cam in s.get("cameras", []):
            lat, cov = cam["capture_to_caption_ms"], cam["coverage_mean"].get(">1%")
            lines.append(f"  camera {cam['camera']} ({cam['source']}): {cam['frames_captioned']} captioned, "
                         f"{cam['frames_dropped']} dropped, {cam['stalls']} stalls, "
                         f"{ms(cam['fps'], '.2f')} captions/s, p50 {ms(lat['p50'])} ms, p99 {ms(lat['p99'])} ms"
                         + ("" if cov is None else f", coverage >1% {100 * cov:.1f}")
                         + f"; stopped by {cam['stopped_by']}")
        return "\n".join(lines)
