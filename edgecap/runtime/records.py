"""Caption records, the JSONL sink and the run summary.

One record per captioned frame:

    {"frame_id", "image_id"?, "source", "t_capture", "wall_time", "caption", "tokens", "beam",
     "latency_ms": {"preprocess", "visual", "encoder", "decode", "detector"?}, "capture_to_caption_ms",
     "header_stamp_ns"?, "log_time_ns"?, "header_frame_id"? (robot logs),
     "objects"?: [{"class", "box", "area", "box_area", "pixel_area"?}],
     "coverage"?: {">1%": .., ">3%": .., ">5%": .., ">10%": ..}, "mentioned"?,
     "hallucinated"?: [{"noun", "class"}], "mentions"?, "precision"?, "f1"?: {">1%": .., ...}}

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
from edgecap.errors import EdgecapError
from edgecap.io import (
    Terminated,
    WorkDir,
    append_whole,
    check_file_target,
    json_file_with,
    write_error,
)

from .camera import Frame, GrabberStats
from .captioner import STAGES, Caption
from .histogram import LogHistogram


class Mentioned(list):
    """What a caption names, per frame: the coverage matches at the lowest threshold (this list
    of {noun, class, profit, exact}, as "mentioned" always was) and the other side of coverage,
    CHAIR-style: `hallucinated` ({noun, class} for every mention of a class not in view),
    `mentions` (how many mentions of a class the caption makes), `precision` (in-view share of
    them, 1 - CHAIR-i; None without any) and `f1` with coverage per threshold label."""

    def __init__(self, matches=(), hallucinated=(), mentions: int = 0, precision: float | None = None,
                 f1: dict[str, float | None] | None = None):
        super().__init__(matches)
        self.hallucinated = list(hallucinated)
        self.mentions = mentions
        self.precision = precision
        self.f1 = dict(f1 or {})

    def to_json(self) -> dict:
        return {"hallucinated": self.hallucinated, "mentions": self.mentions,
                "precision": None if self.precision is None else round(self.precision, 6),
                "f1": {k: (None if v is None else round(v, 6)) for k, v in self.f1.items()}}


@dataclass
class Record:
    frame: Frame
    caption: Caption
    source: str
    t_done: float                                 # time.monotonic() when the caption was ready
    coverage: dict[str, float | None] | None = None
    matches: list[dict] | None = None             # coverage matches at the lowest threshold (a Mentioned)
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
            out["mentioned"] = list(self.matches or [])
            if isinstance(self.matches, Mentioned):
                out.update(self.matches.to_json())
        return out

    def human(self) -> str:
        c = self.caption
        parts = [f"[{self.frame.frame_id:>6}]" if self.camera is None
                 else f"[cam{self.camera} {self.frame.frame_id:>6}]", f"{self.capture_to_caption_ms:7.1f} ms",
                 f"beam {c.beam}", c.text or "(empty caption)"]
        if self.coverage is not None:
            cells = [f"{k}={'-' if v is None else f'{100 * v:.0f}%'}" for k, v in self.coverage.items()]
            parts.append("| coverage " + " ".join(cells))
            hallucinated = getattr(self.matches, "hallucinated", None)
            if hallucinated:
                parts.append("| not in view: " + ", ".join(sorted({h["class"] for h in hallucinated})))
        return "  ".join(parts)


RESERVE_BYTES = 16 * 1024  # kept free beside a caption log for its last line (a summary: a few kB)


class JsonlWriter:
    """Writes one JSON line per record, straight to the file (unbuffered); `close()` is idempotent.

    `append` keeps what the file holds (a service restarted after a camera loss must not wipe
    its history) and starts on a fresh line if the previous process died mid-line. A line that
    cannot be written whole (a full disk) is cut off again (`edgecap.io.append_whole`): the
    records before it stay whole, and `end()` can still close the log with a line saying why
    the run was cut short.
    """

    def __init__(self, path: str | os.PathLike, append: bool = False):
        self.path = Path(path)
        # the file is written in place (a killed run keeps its records), so the claim on it is
        # a work directory beside it: a second writer is refused before it truncates anything
        self._claim = WorkDir(self.path, "--jsonl", exclusive=True)
        # room for the log's last line on a disk that fills up: a file in the claim (same file
        # system), deleted just before that line is written
        self._reserve = self._claim.file(".reserve")
        try:
            self._reserve.write_bytes(bytes(RESERVE_BYTES))
            self._fh = self.path.open("ab" if append else "wb", buffering=0)
        except OSError as exc:
            self._claim.close()
            raise write_error(exc, self.path, "--jsonl") or exc from None
        except BaseException:
            self._claim.close()
            raise
        self.count = 0
        self.failed = False
        if append and self._fh.tell() > 0 and not _ends_with_newline(self.path):
            self._put(b"\n")

    def write(self, obj: dict) -> None:
        self._put((json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8"))
        self.count += 1

    def _put(self, data: bytes) -> None:
        try:
            append_whole(self._fh, data, self.path, "--jsonl")
        except EdgecapError as exc:
            self.failed = True
            raise EdgecapError(f"{exc}; the {self.count} record{'s' * (self.count != 1)} written before it "
                               "are whole") from None

    def end(self, line: dict, short: dict) -> None:
        """The log's last line: `line` (a run_end with the run's summary), or when it does not fit
        (the disk is full) the `short` one; when neither fits, the log ends with its last whole
        record. Never raises an error of its own: the run's own error is what is reported."""
        self._reserve.unlink(missing_ok=True)
        for candidate in (line, short):
            try:
                self.write(candidate)
                return
            except (EdgecapError, OSError, ValueError):
                continue

    def close(self) -> None:
        try:
            if not self._fh.closed:
                fh = self._fh
                try:
                    os.fsync(fh.fileno())  # a file system that allocates late reports a full disk here
                finally:
                    fh.close()
        except OSError as exc:
            raise write_error(exc, self.path, "--jsonl") or exc from None
        finally:
            self._claim.close()


def cut_short(summary: dict, exc: BaseException) -> tuple[dict, dict]:
    """The run_end lines (with the run's summary so far; without) that end a caption log whose
    run did not finish in order: `stopped_by` says what cut it short, `cut_short` marks it."""
    if isinstance(exc, Terminated):
        reason = f"terminated ({exc})"
    elif isinstance(exc, KeyboardInterrupt):
        reason = "interrupted (SIGINT)"
    else:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = f"error: {text[:300]}"
    short = {"kind": RUN_END, "stopped_by": reason, "cut_short": True}
    return {**summary, **short}, short


def check_jsonl_target(path: str | os.PathLike, append: bool) -> None:
    """Refuse (one line) a --jsonl FILE, or the FILE.summary.json beside it, that exists and is
    not what `edgecap run` writes: replacing or appending to it would spoil someone's file."""
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
    # the other side of coverage (Mentioned), as running sums: mentions of a class, those not in
    # view, captions with one, and precision / F1 sums over the captions they are defined for
    mention_frames: int = 0
    mentions: int = 0
    hallucinated: int = 0
    hallucinating_frames: int = 0
    precision_sum: float = 0.0
    precision_frames: int = 0
    f1_sums: dict[str, float] = field(default_factory=dict)
    f1_counts: dict[str, int] = field(default_factory=dict)

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
        if isinstance(record.matches, Mentioned):
            self._add_mentions(record.matches)

    def _add_mentions(self, m: Mentioned) -> None:
        self.mention_frames += 1
        self.mentions += m.mentions
        self.hallucinated += len(m.hallucinated)
        self.hallucinating_frames += bool(m.hallucinated)
        if m.precision is not None:
            self.precision_sum += m.precision
            self.precision_frames += 1
        for key, value in m.f1.items():
            if value is not None:
                self.f1_sums[key] = self.f1_sums.get(key, 0.0) + value
                self.f1_counts[key] = self.f1_counts.get(key, 0) + 1

    def hallucination(self) -> dict | None:
        """CHAIR-i / CHAIR-s over the run's scored frames, mean precision and F1 (None: no
        frame was scored)."""
        frames = self.mention_frames
        if not frames:
            return None
        return {
            "CHAIR-i": round(self.hallucinated / self.mentions, 6) if self.mentions else 0.0,
            "CHAIR-s": round(self.hallucinating_frames / frames, 6),
            "frames": frames, "mentions": self.mentions, "hallucinated_mentions": self.hallucinated,
            "frames_with_hallucination": self.hallucinating_frames,
            "precision_mean": round(self.precision_sum / self.precision_frames, 6) if self.precision_frames else None,
            "precision_frames": self.precision_frames,
            "f1_mean": {k: round(self.f1_sums[k] / n, 6) for k, n in self.f1_counts.items()},
        }

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
            **({"hallucination": h} if (h := self.hallucination()) is not None else {}),
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
        if s.get("hallucination"):
            h = s["hallucination"]
            f1 = ", ".join(f"{k} {100 * v:.1f}" for k, v in h["f1_mean"].items())
            lines.append(f"  not in view: {h['hallucinated_mentions']} of {h['mentions']} class mentions "
                         f"(CHAIR-i {100 * h['CHAIR-i']:.1f}%), in {h['frames_with_hallucination']} captions "
                         f"(CHAIR-s {100 * h['CHAIR-s']:.1f}%); mean precision "
                         + ("-" if h["precision_mean"] is None else f"{100 * h['precision_mean']:.1f}")
                         + (f", mean F1 {f1}" if f1 else ""))
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
