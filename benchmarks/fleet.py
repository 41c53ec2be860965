"""`edgecap fleet` against `edgecap run --replay fast` on the same synthetic robot logs.

    python benchmarks/fleet.py [--bundle DIR] [--logs 4] [--frames 300] [--size 96]
        [--repeats 1] [--out DIR] [--quick]

Writes `--logs` robot logs of the synthetic world's moving camera (`edgecap data synth --mcap`,
a different world seed each), then captions all of them, each configuration in its own process
as a user runs it:

    run              `edgecap run LOG --replay fast` per log, one after another, as a robot
                     runs it (onnxruntime's threads on all cores, spinning between ops)
    run, T threads   the same with --threads T --no-spin: a caption actor's onnxruntime settings
    run, P processes P such processes at once, each taking its share of the logs: parallelism
                     without Ray
    fleet A x T      `edgecap fleet LOGS` on a local Ray cluster of this machine's cores, A
                     actors of T onnxruntime threads each

and reads each one's summary. "captions/s" is the steady rate: captions over the time between
the first and the last caption (for `run`, per process summed over its logs, and the processes'
rates added), so it leaves out process and Ray start-up and the bundle loading, reported apart
("start-up s": for `run`, its wall time less its captioning time; for the fleet, the time to its
first caption). Each `run` writes its caption log (--out-mcap), as the fleet does, and runs at
the niceness Ray gives its workers (15), so that on a shared machine both get the same priority.

"x its run" is a fleet's captions/s over those of the `run` of the same processes, onnxruntime
threads and spin (Ray's overhead is 1 minus it): one actor with one process, A actors of one thread with A processes of one thread. "per
busy second" is an actor's captions over the time it spent in its calls, the figure to project
a cluster from (docs/fleet.md). Medians over --repeats rounds, each round running every
configuration once (the machine's load drifts). The model is the packaged demo (exported once,
beam 3) unless --bundle names one. Writes results/fleet/fleet.json, fleet.md and fleet.png.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, host_info, print_table, save_png, write_json  # noqa: E402

from edgecap.argtypes import BEAM, COUNT, IMAGE_SIDE, Integer, Parser  # noqa: E402

LOGS = Integer(1, 64)


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", default=None, help="an exported bundle (default: the demo model, exported once)")
    p.add_argument("--checkpoint", default=None, help="export this checkpoint instead of the demo model")
    p.add_argument("--beam", type=BEAM, default=3, help="beam of the exported demo bundle (default 3)")
    p.add_argument("--logs", type=LOGS, default=4, help="synthetic robot logs (default 4)")
    p.add_argument("--frames", type=COUNT, default=300, help="camera images per log (default 300)")
    p.add_argument("--size", type=IMAGE_SIDE, default=96, help="image side in pixels (default 96)")
    p.add_argument("--repeats", type=COUNT, default=1, help="runs of each configuration (default 1)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fleet"),
                   help="results folder (default benchmarks/results/fleet)")
    p.add_argument("--quick", action="store_true",
                   help="2 logs of 12 frames, one repeat, one run and one fleet configuration (a smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.logs, args.frames, args.repeats = 2, 12, 1
    return args


def write_logs(workdir: Path, count: int, frames: int, size: int) -> Path:
    """`count` synthetic robot logs, logs/log_<i>.mcap, each the clip `edgecap data synth --mcap`
    writes, rendered from world seed i."""
    from edgecap.data.synth import generate_dataset

    logs = workdir / "logs"
    logs.mkdir()
    for i in range(count):
        world = workdir / f"world_{i}"
        generate_dataset(world, 1, seed=i, size=size, sequences=0, video_frames=frames, progress=False,
                         mcap=True)
        shutil.move(world / "video" / "tabletop.mcap", logs / f"log_{i}.mcap")
        shutil.rmtree(world)
    return logs


# Ray starts its worker processes (the read tasks and the caption actors) at nice 15, so that its
# own services stay responsive (RayConfig worker_niceness). On an idle machine that changes
# nothing; on a shared one a niced process gets a small share of the CPUs, so the `run`s are
# niced the same and the comparison is of Ray's machinery, not of priorities.
RAY_WORKER_NICENESS = 15


def _edgecap(*argv, nice: int = 0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgecap.cli", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, preexec_fn=(lambda: os.nice(nice)) if nice else None)


def _failed(proc) -> str:
    return (proc.stderr.strip().splitlines() or ["?"])[-1][:200]


def _run_logs(bundle: Path, logs: list[Path], threads: int, spin: bool, workdir: Path) -> dict:
    """`edgecap run` over `logs`, one process after another, each writing its caption log as the
    fleet does: (captions, steady captions/s, seconds captioning)."""
    captions, span = 0, 0.0
    for log in logs:
        jsonl = workdir / f"{log.stem}.jsonl"
        proc = _edgecap("run", bundle, "--source", log, "--replay", "fast", "--no-coverage", "--quiet",
                        "--threads", threads, "--spin" if spin else "--no-spin", "--jsonl", jsonl,
                        "--out-mcap", workdir / f"{log.stem}.captions.mcap", nice=RAY_WORKER_NICENESS)
        if proc.returncode != 0:
            raise RuntimeError(_failed(proc))
        summary = json.loads(jsonl.with_suffix(".summary.json").read_text())
        n = summary["frames_captioned"]
        captions += n
        span += (n - 1) / summary["fps"]
    return {"captions": captions, "rate": (captions - len(logs)) / span, "span": span}


def run_single(bundle: Path, logs: Path, processes: int, threads: int, spin: bool, workdir: Path) -> dict:
    """`edgecap run` over every log: `processes` at a time, each taking its share of the logs
    one after another; the steady rate is the sum of the processes' own."""
    from concurrent.futures import ThreadPoolExecutor

    files = sorted(logs.glob("*.mcap"))
    shares = [files[i::processes] for i in range(processes)]
    began = time.perf_counter()
    try:
        with ThreadPoolExecutor(processes) as pool:
            parts = list(pool.map(lambda share: _run_logs(bundle, share, threads, spin, workdir), shares))
    except RuntimeError as exc:
        return {"status": "failed", "reason": str(exc)}
    wall = time.perf_counter() - began
    return {"status": "ok", "captions": sum(p["captions"] for p in parts),
            "captions_per_s": sum(p["rate"] for p in parts),
            "startup_s": wall - max(p["span"] for p in parts), "wall_s": wall}


def run_fleet(bundle: Path, logs: Path, actors: int, threads: int, workdir: Path) -> dict:
    out = workdir / "fleet-out"
    began = time.perf_counter()
    proc = _edgecap("fleet", bundle, logs, "--out", out, "--actors", actors, "--threads", threads,
                    "--num-cpus", os.cpu_count() or 1, "--no-coverage", "--quiet")
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        return {"status": "failed", "reason": _failed(proc)}
    summary = json.loads((out / "summary.json").read_text())
    per_actor = [a["captions_per_busy_s"] for a in summary["actors"] if a["captions_per_busy_s"]]
    return {"status": "ok", "captions": summary["images_captioned"], "captions_per_s": summary["captions_per_s"],
            "startup_s": summary["startup_s"], "wall_s": wall, "actors_seen": len(summary["actors"]),
            "per_actor_busy": per_actor}


def configurations(cores: int, quick: bool = False):
    """(name, kind, processes or actors, onnxruntime threads, spin, the run it is compared with).
    A caption actor's onnxruntime threads sleep when idle (no spin), so each fleet is compared with
    the `run` of the same processes, threads and spin; `run` as a robot runs it (all cores,
    spinning) is shown too."""
    if quick:  # one of each kind: the script's plumbing, in one Ray start
        yield "run, 1 thread", "run", 1, 1, False, None
        yield "fleet 1 actor x 1 thread", "fleet", 1, 1, False, "run, 1 thread"
        return
    yield "run", "run", 1, 0, True, None
    yield "run, 1 thread", "run", 1, 1, False, None
    yield f"run, {cores} threads, no spin", "run", 1, cores, False, None
    yield f"run, {cores} processes x 1 thread", "run", cores, 1, False, None
    yield "fleet 1 actor x 1 thread", "fleet", 1, 1, False, "run, 1 thread"
    yield f"fleet 1 actor x {cores} threads", "fleet", 1, cores, False, f"run, {cores} threads, no spin"
    yield f"fleet {cores} actors x 1 thread", "fleet", cores, 1, False, f"run, {cores} processes x 1 thread"


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out)
    cores = os.cpu_count() or 1
    rows, runs = [], {}
    with tempfile.TemporaryDirectory(prefix="edgecap-fleet-bench-") as tmp:
        tmp = Path(tmp)
        from loop import make_bundle  # the demo bundle, exported once, as the loop benchmark does

        bundle = make_bundle(args, tmp)
        logs = write_logs(tmp, args.logs, args.frames, args.size)
        print(f"{args.logs} logs x {args.frames} images of {args.size} px; bundle {bundle}", flush=True)
        for _ in range(args.repeats):  # rounds of every configuration: the machine's load drifts
            for name, kind, actors, threads, spin, _against in configurations(cores, args.quick):
                work = Path(tempfile.mkdtemp(dir=tmp))
                load = os.getloadavg()[0]
                result = run_single(bundle, logs, actors, threads, spin, work) if kind == "run" else \
                    run_fleet(bundle, logs, actors, threads, work)
                result["load_1m"] = load
                runs.setdefault(name, []).append(result)
                shutil.rmtree(work)
                print(f"  {name}: {result}", flush=True)
        for name, kind, actors, threads, _spin, against in configurations(cores, args.quick):
            results = runs[name]
            ok = [r for r in results if r["status"] == "ok"]
            row = {"configuration": name, "kind": kind, "processes": actors, "threads": threads or "auto",
                   "against": against, "runs": len(ok)}
            if not ok:
                rows.append({**row, "status": "failed", "reason": results[-1]["reason"]})
                continue
            row.update({"status": "ok", "captions": ok[0]["captions"],
                        "captions_per_s": statistics.median(r["captions_per_s"] for r in ok),
                        "startup_s": statistics.median(r["startup_s"] for r in ok),
                        "wall_s": statistics.median(r["wall_s"] for r in ok),
                        "load_1m": statistics.median(r["load_1m"] for r in ok)})
            busy = [v for r in ok for v in r.get("per_actor_busy", [])]
            row["per_actor_busy_s"] = statistics.median(busy) if busy else None
            rows.append(row)
    by_name = {r["configuration"]: r for r in rows if r["status"] == "ok"}
    for row in rows:
        base = by_name.get(row["against"] or "")
        if row["status"] == "ok" and base:
            row["vs_run"] = row["captions_per_s"] / base["captions_per_s"]
            row["ray_overhead"] = 1 - row["vs_run"]
    columns = [("configuration", "configuration", ""), ("captions_per_s", "captions/s", ".1f"),
               ("vs_run", "x its run", ".2f"), ("per_actor_busy_s", "per actor busy s", ".1f"),
               ("startup_s", "start-up s", ".1f"), ("wall_s", "wall s", ".1f"), ("load_1m", "load 1m", ".1f")]
    print(f"\n{args.logs} logs x {args.frames} images, median of {args.repeats}; {cores} cores")
    print_table(rows, columns)
    result = {"logs": args.logs, "frames": args.frames, "size": args.size, "repeats": args.repeats,
              "bundle": str(args.bundle or "demo"), "rows": rows, "runs": runs,
              "host": host_info(("numpy", "onnxruntime", "ray", "pyarrow", "mcap"))}
    write_json(out_dir / "fleet.json", result)
    _write_markdown(out_dir / "fleet.md", rows)
    _plot(out_dir / "fleet.png", rows, args)
    print(f"wrote {out_dir / 'fleet.json'}, fleet.md, fleet.png")
    return 0


def _fmt(value, spec):
    return "–" if value is None else format(value, spec)


def _write_markdown(path: Path, rows: list[dict]) -> None:
    from edgecap.io import write_text_atomic

    lines = ["| configuration | captions/s | × its `run` | captions per busy s, per actor | start-up s | wall s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['configuration']} | failed: {r['reason']} | | | | |")
            continue
        lines.append(f"| {r['configuration']} | {r['captions_per_s']:.1f} | {_fmt(r.get('vs_run'), '.2f')} | "
                     f"{_fmt(r.get('per_actor_busy_s'), '.1f')} | {r['startup_s']:.1f} | {r['wall_s']:.1f} |")
    write_text_atomic(path, "\n".join(lines) + "\n")


def _plot(path: Path, rows: list[dict], args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    colours = ["#888888" if r["kind"] == "run" else "#2b7bb9" for r in ok]
    ax.barh([r["configuration"] for r in ok], [r["captions_per_s"] for r in ok], color=colours)
    for i, r in enumerate(ok):
        note = f"{r['captions_per_s']:.1f}" + (f"  ({r['vs_run']:.2f}x {r['against']})"
                                               if r.get("vs_run") is not None else "")
        ax.text(r["captions_per_s"], i, " " + note, va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("captions per second (steady, first to last caption)")
    ax.set_title(f"edgecap fleet vs edgecap run: {args.logs} logs x {args.frames} images", fontsize=10)
    ax.set_xlim(0, max(r["captions_per_s"] for r in ok) * 1.9)
    save_png(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
