"""The runtime loop on a video at target rates: achieved FPS, dropped frames, latency.

    python benchmarks/loop.py [--checkpoint CKPT | --bundle DIR] [--video FILE]
        [--rates 2,5,10,0] [--frames 60] [--source-fps 15] [--out DIR] [--quick]

Runs `edgecap run BUNDLE --source VIDEO --pace native` once per target rate (`--max-fps`;
0 = as fast as it can) in a subprocess, as on a robot, and reads its summary: frames
captioned and dropped, achieved FPS, capture-to-caption p50/p95/p99. The video defaults to
the synthetic world's moving-camera clip and the model to the packaged demo checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, host_info, print_table, write_csv, write_json  # noqa: E402

from edgecap.argtypes import BEAM, COUNT, POSITIVE, ListOf, Number, Parser  # noqa: E402


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None, help="export this checkpoint (default: the demo model)")
    p.add_argument("--bundle", default=None, help="use an existing bundle instead of exporting")
    p.add_argument("--video", default=None, help="video file (default: the synthetic world's clip)")
    p.add_argument("--rates", type=ListOf(Number(0)), default="2,5,10,0", help="--max-fps values; 0 = unlimited")
    p.add_argument("--frames", type=COUNT, default=60, help="captions per rate")
    p.add_argument("--source-fps", type=POSITIVE, default=15.0, help="video playback rate (native pacing)")
    p.add_argument("--beam", type=BEAM, default=3)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "loop"))
    p.add_argument("--quick", action="store_true", help="few frames and rates (tests)")
    args = p.parse_args(argv)
    if args.quick:
        args.frames, args.rates = min(args.frames, 6), args.rates[:2]
    return args


def make_video(workdir: Path, frames: int, fps: float) -> Path:
    from edgecap.data.synth import generate_dataset

    out = workdir / "world"
    generate_dataset(out, n_images=1, seed=7, size=96, sequences=1, frames_per_sequence=2,
                     video_frames=frames, fps=fps)
    return out / "video" / "tabletop.mp4"


def make_bundle(args, workdir: Path) -> Path:
    if args.bundle:
        return Path(args.bundle)
    from edgecap.export.demo_command import demo_checkpoint, ensure_bundle

    checkpoint = Path(args.checkpoint) if args.checkpoint else demo_checkpoint()
    return ensure_bundle(checkpoint, workdir / "export", beam=args.beam, log=lambda msg: print(msg, flush=True))


def run_rate(bundle: Path, video: Path, rate: float, args, workdir: Path) -> dict:
    jsonl = workdir / f"rate{rate:g}.jsonl"
    cmd = [sys.executable, "-m", "edgecap.cli", "run", str(bundle), "--source", str(video),
           "--pace", "native", "--source-fps", str(args.source_fps), "--frames", str(args.frames),
           "--beam", str(args.beam), "--jsonl", str(jsonl), "--no-coverage", "--quiet"]
    if rate > 0:
        cmd += ["--max-fps", str(rate)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    row = {"target_fps": rate or None, "source_fps": args.source_fps, "beam": args.beam}
    from edgecap.runtime.records import summary_path

    path = summary_path(str(jsonl))
    if proc.returncode != 0 or not path.exists():
        return {**row, "status": "failed", "reason": (proc.stderr.strip().splitlines() or ["?"])[-1][:160]}
    s = json.loads(path.read_text())
    lat = s["capture_to_caption_ms"]
    return {**row, "status": "ok", "captioned": s["frames_captioned"], "dropped": s["frames_dropped"],
            "skipped": s["frames_skipped"], "fps": s["fps"], "latency_p50_ms": lat["p50"],
            "latency_p95_ms": lat["p95"], "latency_p99_ms": lat["p99"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgecap-loop-") as tmp:
        workdir = Path(tmp)
        # enough video for the slowest rate: frames / rate seconds of playback
        slowest = min((r for r in args.rates if r > 0), default=args.source_fps)
        video = Path(args.video) if args.video else make_video(
            workdir, int(args.source_fps * (args.frames / slowest + 2)), args.source_fps)
        bundle = make_bundle(args, workdir)
        rows = [run_rate(bundle, video, rate, args, workdir) for rate in args.rates]
    print_table(rows, [("status", "status", ""), ("target_fps", "target fps", ""), ("fps", "achieved fps", ".2f"),
                       ("captioned", "captioned", "d"), ("dropped", "dropped", "d"),
                       ("latency_p50_ms", "p50 ms", ".1f"), ("latency_p99_ms", "p99 ms", ".1f")])
    write_json(out / "loop.json", {"host": host_info(), "args": vars(args) | {"rates": args.rates}, "rows": rows})
    write_csv(out / "loop.csv", rows)
    print(f"wrote {out / 'loop.json'}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
