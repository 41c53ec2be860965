"""Soak: resident memory of `edgecap run` over many frames, with and without coverage.

    python benchmarks/soak.py [--checkpoint CKPT | --bundle DIR] [--frames 20000]
        [--warmup 2000] [--windows 5] [--size 64] [--beam 1] [--out DIR] [--quick]
    python benchmarks/soak.py --reanalyse DIR [--warmup N] [--windows N]

Runs `edgecap run BUNDLE --source synth://tabletop --pace every --frames N --jsonl FILE` as a
subprocess, as on a robot, once with coverage (the synthetic world's ground-truth objects,
spaCy nouns and the per-caption cache) and once with `--no-coverage`. While it runs, the
process's resident set size (VmRSS in /proc/PID/status) is sampled with the number of records
its JSONL holds. After the warm-up frames (imports, onnxruntime arenas, spaCy's first parses)
the growth is the least-squares slope of RSS against frames, reported in bytes per frame, kB
per 10k frames and MB per 100k frames, and plotted (`soak.png`). The same slope is also given
for each of `--windows` equal spans of the run, so growth that levels off (bounded caches and
free lists filling) is told apart from growth that goes on. `--reanalyse DIR` fits a finished
run's samples again (another warm-up, other windows) without running it again. Goal with
coverage on: under 1 MB per 100k frames. Not a timed test: one run measures one machine; Linux
only (/proc).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    REPO,
    check_folder_arg,
    host_info,
    one_line_errors,
    print_table,
    save_png,
    write_csv,
    write_json,
)

from edgecap.argtypes import BEAM, COUNT, IMAGE_SIDE, POSITIVE, Integer, Parser  # noqa: E402

GOAL_MB_PER_100K = 1.0
# The run inherits these; glibc's arenas and trim threshold change resident growth, so an A/B
# of them must say which setting each result had.
ALLOCATOR_ENV = ("MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None, help="export this checkpoint (default: the demo model)")
    p.add_argument("--bundle", default=None, help="use an existing bundle instead of exporting")
    p.add_argument("--frames", type=COUNT, default=20000, help="captions per run")
    p.add_argument("--warmup", type=Integer(0), default=None,
                   help="frames left out of the growth fit (default 2000; with --reanalyse, the run's own)")
    p.add_argument("--windows", type=COUNT, default=5, help="spans of the run, each with its own growth")
    p.add_argument("--reanalyse", default=None, metavar="DIR",
                   help="fit the samples of a finished run in DIR (its soak.json, soak_samples.csv) again")
    p.add_argument("--size", type=IMAGE_SIDE, default=64, help="side of the synthetic world's frames")
    p.add_argument("--beam", type=BEAM, default=1)
    p.add_argument("--interval", type=POSITIVE, default=0.25, help="seconds between RSS samples")
    p.add_argument("--out", default=None, help="results folder (default benchmarks/results/soak; with "
                                               "--reanalyse, the run's own folder)")
    p.add_argument("--quick", action="store_true", help="a few hundred frames (tests)")
    args = p.parse_args(argv)
    args.recorded = args.samples = None
    if args.reanalyse:
        args.recorded = _recorded_run(Path(args.reanalyse) / "soak.json", p)
        args.samples = _recorded_samples(Path(args.reanalyse) / "soak_samples.csv", args.recorded, p)
        run = args.recorded["args"]
        args.frames = run["frames"]
        args.warmup = run["warmup"] if args.warmup is None else args.warmup
    if args.out is None:
        args.out = args.reanalyse or str(REPO / "benchmarks" / "results" / "soak")
    check_folder_arg(p, args.out)
    if args.checkpoint is not None and not Path(args.checkpoint).is_file():
        p.error(f"--checkpoint {args.checkpoint}: no such file (an edgecap checkpoint, .pt)")
    if args.warmup is None:
        args.warmup = 2000
    if args.quick:
        args.frames, args.warmup, args.interval = min(args.frames, 240), min(args.warmup, 60), 0.05
    if args.warmup >= args.frames:
        p.error(f"--warmup {args.warmup} leaves nothing to measure of --frames {args.frames}")
    return args


def _recorded_run(path: Path, parser) -> dict:
    """The soak.json of a finished run, or a one-line error naming what is wrong with it."""
    try:
        recorded = json.loads(path.read_text())
    except OSError as exc:
        parser.error(f"--reanalyse: cannot read {path} ({exc.strerror}); expected a soak.py --out directory")
    except ValueError as exc:
        parser.error(f"--reanalyse: {path} is not JSON ({exc}); expected what soak.py writes")
    run = recorded.get("args") if isinstance(recorded, dict) else None
    if not isinstance(run, dict) or not {"frames", "warmup"} <= set(run) or not isinstance(recorded.get("rows"), list):
        parser.error(f"--reanalyse: {path} lacks 'args' (with 'frames' and 'warmup') or 'rows'; "
                     "expected what soak.py writes")
    return recorded


SAMPLE_COLUMNS = ("mode", "seconds", "frames", "rss_bytes")


def _recorded_samples(path: Path, recorded: dict, parser) -> list[dict]:
    """The soak_samples.csv of a finished run, or a one-line error naming what is wrong with it."""
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        samples = [{"mode": s["mode"], "seconds": float(s["seconds"]), "frames": int(s["frames"]),
                    "rss_bytes": int(s["rss_bytes"])} for s in rows]
    except OSError as exc:
        parser.error(f"--reanalyse: cannot read {path} ({exc.strerror}); expected the samples soak.py writes "
                     "beside soak.json")
    except (KeyError, TypeError, ValueError, csv.Error) as exc:
        parser.error(f"--reanalyse: {path} is not soak.py's samples ({type(exc).__name__}: {exc}); expected the "
                     f"columns {', '.join(SAMPLE_COLUMNS)} with numbers")
    measured = {r.get("mode") for r in recorded["rows"] if isinstance(r, dict) and r.get("status") == "ok"}
    missing = sorted(str(m) for m in measured - {s["mode"] for s in samples})
    if missing:
        parser.error(f"--reanalyse: {path} holds no samples of {', '.join(missing)}, which soak.json lists as run")
    return samples


def make_bundle(args, workdir: Path) -> Path:
    if args.bundle:
        return Path(args.bundle)
    from edgecap.export.demo_command import demo_checkpoint, ensure_bundle

    checkpoint = Path(args.checkpoint) if args.checkpoint else demo_checkpoint()
    return ensure_bundle(checkpoint, workdir / "export", beam=args.beam, log=lambda msg: print(msg, flush=True))


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class LineCounter:
    """Newlines in a file that another process appends to, read incrementally."""

    def __init__(self, path: Path):
        self.path, self.offset, self.lines = path, 0, 0

    def count(self) -> int:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return 0
        self.offset += len(chunk)
        self.lines += chunk.count(b"\n")
        return self.lines


def soak(bundle: Path, coverage: bool, args, workdir: Path) -> tuple[dict, list[dict]]:
    """Run once; -> (row, samples)."""
    label = "coverage" if coverage else "no coverage"
    jsonl = workdir / f"soak-{'cov' if coverage else 'nocov'}.jsonl"
    cmd = [sys.executable, "-m", "edgecap", "run", str(bundle), "--source", f"synth://tabletop?seed=3&size={args.size}",
           "--pace", "every", "--frames", str(args.frames), "--beam", str(args.beam), "--jsonl", str(jsonl),
           "--quiet", "--coverage" if coverage else "--no-coverage"]
    counter, samples = LineCounter(jsonl), []
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        rss = rss_bytes(proc.pid)
        if rss is not None:
            samples.append({"mode": label, "seconds": round(time.monotonic() - started, 3),
                            "frames": counter.count(), "rss_bytes": rss})
        time.sleep(args.interval)
    err = proc.stderr.read()
    row = {"mode": label, "frames": args.frames, "warmup": args.warmup}
    if proc.returncode != 0:
        return {**row, "status": "failed", "reason": (err.strip().splitlines() or ["?"])[-1][:160]}, samples
    return {**row, "status": "ok", "seconds": round(time.monotonic() - started, 1),
            **fitted(samples, args)}, samples


def fitted(samples: list[dict], args) -> dict:
    """The growth after warm-up and in each window of the run."""
    return {**growth(samples, args.warmup, args.frames), "windows": windows(samples, args.frames, args.windows)}


def windows(samples: list[dict], frames: int, count: int) -> list[dict]:
    """Growth in `count` equal spans of frames over the whole run (the first holds start-up).
    A bounded structure filling shows as windows whose growth falls towards zero."""
    edges = [round(frames * i / count) for i in range(count + 1)]
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        fit = growth(samples, lo, hi)
        out.append({"from_frame": lo, "to_frame": hi, "mb_per_100k_frames": fit.get("mb_per_100k_frames"),
                     "rss_end_mb": fit.get("rss_end_mb")})
    return out


def growth(samples: list[dict], warmup: int, frames: int) -> dict:
    """Least-squares slope of RSS against frames after `warmup` (one point per frame count: the
    last sample taken at it), up to the last frame (after it the process writes its summary
    and tears down, which is not growth)."""
    import numpy as np

    at = {s["frames"]: s["rss_bytes"] for s in samples if warmup < s["frames"] < frames}
    if len(at) < 3:
        return {"samples_fitted": len(at), "bytes_per_frame": None}
    frames = np.array(sorted(at), float)
    rss = np.array([at[f] for f in sorted(at)], float)
    slope = float(np.polyfit(frames, rss, 1)[0])
    return {"samples_fitted": len(at), "rss_after_warmup_mb": round(rss[0] / 1e6, 1),
            "rss_end_mb": round(rss[-1] / 1e6, 1), "bytes_per_frame": round(slope, 1),
            "kb_per_10k_frames": round(slope * 1e4 / 1e3, 1), "mb_per_100k_frames": round(slope * 1e5 / 1e6, 2)}


def plot(samples: list[dict], rows: list[dict], warmup: int, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (whole, after, spans) = plt.subplots(1, 3, figsize=(16, 4))
    for row in rows:
        mine = [s for s in samples if s["mode"] == row["mode"]]
        whole.plot([s["frames"] for s in mine], [s["rss_bytes"] / 1e6 for s in mine], label=row["mode"])
        measured = [s for s in mine if warmup < s["frames"] < row["frames"]]
        if measured and row.get("bytes_per_frame") is not None:
            base = measured[0]["rss_bytes"]
            after.plot([s["frames"] for s in measured], [(s["rss_bytes"] - base) / 1e6 for s in measured],
                       label=f"{row['mode']}: {row['kb_per_10k_frames']:g} kB / 10k frames")
    whole.axvline(warmup, color="grey", linestyle=":", label="end of warm-up")
    whole.set(xlabel="frames captioned", ylabel="resident memory (MB)", title="the whole run")
    after.set(xlabel="frames captioned", ylabel="growth since warm-up (MB)", title="after warm-up (the fitted part)")
    width = 0.8 / max(1, len(rows))
    for i, row in enumerate(rows):
        grew = [w["mb_per_100k_frames"] for w in row.get("windows", [])]
        spans.bar([j + i * width for j in range(len(grew))], [g or 0.0 for g in grew], width, label=row["mode"])
    labels = [f"{w['from_frame'] // 1000}k-{w['to_frame'] // 1000}k" for w in (rows[0].get("windows") or [])]
    spans.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(labels))], labels, rotation=45, fontsize=7)
    spans.axhline(GOAL_MB_PER_100K, color="red", linestyle="--", label=f"goal: {GOAL_MB_PER_100K:g} MB / 100k")
    spans.set(xlabel="span of the run (frames)", ylabel="growth (MB per 100k frames)", title="growth in each span")
    for ax in (whole, after, spans):
        ax.legend(loc="best", fontsize=8)
    fig.suptitle("edgecap run: resident memory over a long run")
    return save_png(fig, path)


def reanalysed(args) -> tuple[dict, list[dict], list[dict]]:
    """(soak.json, rows, samples) of a finished run, its rows fitted again with `args`."""
    recorded, samples = dict(args.recorded), args.samples
    rows = []
    for row in recorded["rows"]:
        if row["status"] == "ok":
            kept = {k: row[k] for k in ("mode", "frames", "status", "seconds") if k in row}
            row = {**kept, "warmup": args.warmup, **fitted([s for s in samples if s["mode"] == row["mode"]], args)}
        rows.append(row)
    recorded["args"] = {**recorded["args"], "warmup": args.warmup, "windows": args.windows}
    return recorded, rows, samples


@one_line_errors
def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.reanalyse:
        recorded, rows, samples = reanalysed(args)
        host, allocator_env, run_args = recorded["host"], recorded.get("allocator_env", {}), recorded["args"]
    else:
        rows, samples = [], []
        with tempfile.TemporaryDirectory(prefix="edgecap-soak-") as tmp:
            bundle = make_bundle(args, Path(tmp))
            for coverage in (True, False):
                row, seen = soak(bundle, coverage, args, Path(tmp))
                rows.append(row)
                samples += seen
        host = host_info()
        allocator_env = {k: os.environ[k] for k in ALLOCATOR_ENV if k in os.environ}
        run_args = {k: v for k, v in vars(args).items() if k != "recorded"}
    print_table(rows, [("status", "status", ""), ("mode", "mode", ""), ("frames", "frames", "d"),
                       ("rss_after_warmup_mb", "RSS after warm-up MB", ".1f"), ("rss_end_mb", "RSS end MB", ".1f"),
                       ("bytes_per_frame", "B / frame", ".1f"), ("kb_per_10k_frames", "kB / 10k frames", ".1f"),
                       ("mb_per_100k_frames", "MB / 100k frames", ".2f")])
    with_coverage = rows[0]
    if with_coverage.get("mb_per_100k_frames") is not None:
        verdict = "meets" if with_coverage["mb_per_100k_frames"] < GOAL_MB_PER_100K else "misses"
        print(f"with coverage: {with_coverage['mb_per_100k_frames']:.2f} MB per 100k frames after warm-up; "
              f"{verdict} the goal of < {GOAL_MB_PER_100K:g} MB")
    for row in rows:
        for span in row.get("windows", []):
            grew = span["mb_per_100k_frames"]
            print(f"  {row['mode']}: frames {span['from_frame']:,}-{span['to_frame']:,}: "
                  + ("too few samples" if grew is None else f"{grew:.2f} MB per 100k frames, RSS {span['rss_end_mb']} MB"))
    write_json(out / "soak.json", {"host": host, "args": run_args, "goal_mb_per_100k": GOAL_MB_PER_100K,
                                   "allocator_env": allocator_env, "rows": rows})
    if not args.reanalyse or out.resolve() != Path(args.reanalyse).resolve():  # --out OTHER gets the samples too
        write_csv(out / "soak_samples.csv", samples)
    plot(samples, rows, args.warmup, out / "soak.png")
    print(f"wrote {out / 'soak.json'}, {out / 'soak.png'}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
