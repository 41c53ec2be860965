"""Fast start: from process start to the first caption, and resident memory, of `edgecap run`.

    python benchmarks/startup.py [--bundles demo,real] [--repeats N] [--out DIR] [--workdir DIR]
        [--quick]

A robot restarts its nodes often; what it waits for is the first caption. Each row runs the
real command, `python -m edgecap run BUNDLE --source synth://tabletop --frames 1 --jsonl F`, in a
fresh process, as a robot's service would, with and without coverage (`--no-coverage`), and with coverage where `import torch` fails (a robot's
install: spaCy's thinc loads torch whenever it can), and so again with `--coverage-load background`
(the default for a camera: the scorer loads after the first caption, which goes out unscored), and
takes from outside it:

- caption: the first caption ready (its record's capture time + capture-to-caption, on the
  machine-wide monotonic clock), counted from just before the process was spawned;
- record: the first record on disk (the JSONL file's modification time), i.e. after coverage;
- exit: the process gone, its summary written;
- peak RSS: the process's peak resident memory (wait4's ru_maxrss).

A second child per row runs the same steps as `edgecap run`, in its order, and stamps each
one (imports, manifest and file hashes, onnxruntime sessions, warm-up, coverage, source, first
caption, scoring): where the time goes. Medians over `--repeats` runs after one run that is not
counted (the page cache warm, as after a restart).

Bundles: `demo` is what `edgecap demo` exports (the packaged demo checkpoint, fp32, batch 1);
`real` is a real-size one, mobilenet_v3_large + SMArT at the paper's size (10,000 words, beam
3) in dynamic int8, random weights (benchmarks/pipeline.py's). `--quick` measures only the demo
bundle, once and with no untimed run first, for the test.

Writes OUT/startup.{json,md}. Coverage rows need edgecap[nlp] (spaCy, GloVe); without it the
command turns coverage off and says so, and the row says `coverage: off`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, check_folder_arg, host_info, one_line_errors, print_table, write_json  # noqa: E402

from edgecap.argtypes import COUNT, Parser  # noqa: E402

BUNDLES = ("demo", "real")
SOURCE = "synth://tabletop?fps=15&size={size}"
# (label, coverage, torch hidden, --coverage-load background): spaCy's thinc imports torch when it can (this venv has it, a
# robot install need not), so coverage is measured both ways
VARIANTS = (("off", False, False, False), ("on", True, False, False), ("on, no torch", True, True, False),
            ("background, no torch", True, True, True))
STEPS = ("imports", "bundle", "make_source", "warm_up", "coverage", "source", "caption", "score")


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundles", default=",".join(BUNDLES))
    p.add_argument("--repeats", type=COUNT, default=5, help="timed runs per row (after one untimed)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "startup"))
    p.add_argument("--workdir", default="", help="keep the exported bundles here and reuse them")
    p.add_argument("--quick", action="store_true", help="the demo bundle, one timed run per row")
    p.add_argument("--stages", nargs=3, metavar=("BUNDLE", "SOURCE", "COVERAGE"), help=argparse_hidden())
    args = p.parse_args(argv)
    args.bundles = [b.strip() for b in args.bundles.split(",") if b.strip()]
    if not args.bundles:
        p.error(f"--bundles names no bundle; choose from {', '.join(BUNDLES)}")
    for name in args.bundles:
        if name not in BUNDLES:
            p.error(f"unknown bundle {name!r}; choose from {', '.join(BUNDLES)}")
    if not args.stages:
        check_folder_arg(p, args.out)
        if args.workdir:
            check_folder_arg(p, args.workdir, "--workdir")
    if args.quick:
        args.bundles, args.repeats = ["demo"], 1
    return args


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


# -- bundles (this process, torch) -------------------------------------------------------------
def demo_bundle(workdir: Path) -> Path:
    from edgecap.export.demo_command import demo_checkpoint, ensure_bundle

    return ensure_bundle(demo_checkpoint(), workdir / "demo", beam=3, log=lambda m: print(m, file=sys.stderr))


def real_bundle(workdir: Path) -> Path:
    """mobilenet_v3_large + SMArT at the paper's size, dynamic int8 (benchmarks/pipeline.py's)."""
    import argparse

    from pipeline import Config, bundle, checkpoint

    args = argparse.Namespace(quick=False, image_size=0)
    ckpt = checkpoint("mobilenet_v3_large", "smart", args, workdir)
    path, why = bundle(Config("mobilenet_v3_large", "smart", "onnxruntime-int8", 1), ckpt, workdir)
    if path is None:
        raise SystemExit(f"real-size bundle: {why}")
    return path


def frame_size(bundle: Path) -> int:
    """The bundle's input side: the synthetic world is rendered at it, as `edgecap demo` does."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    return int(manifest["preprocessing"]["size"])


# -- one start, from outside ----------------------------------------------------------------
SPAWNER = """
import json, os, resource, subprocess, sys, time
cmd = json.loads(sys.argv[1])
wall0, t0 = time.time(), time.monotonic()
code = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
end = time.monotonic()
if code:
    sys.exit(code)
print(json.dumps({"t0": t0, "wall0": wall0, "exit": end,
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def run_once(bundle: Path, variant: tuple, workdir: Path) -> dict:
    """Spawn `edgecap run`, wait for it; -> the times (s, from the spawn) and its peak RSS."""
    with tempfile.TemporaryDirectory(dir=workdir) as scratch:
        return _run_once(bundle, variant, Path(scratch) / "captions.jsonl")


def python_cmd(no_torch: bool) -> list[str]:
    """This interpreter; with `no_torch`, as on a robot installed without torch (`import torch`
    fails, so spaCy's thinc does not load it)."""
    return [sys.executable, "-c", "import sys; sys.modules['torch'] = None; from edgecap.cli import main; "
            "sys.exit(main())"] if no_torch else [sys.executable, "-m", "edgecap"]


def _run_once(bundle: Path, variant: tuple, jsonl: Path) -> dict:
    _, coverage, no_torch, background = variant
    cmd = [*python_cmd(no_torch), "run", str(bundle), "--source", SOURCE.format(size=frame_size(bundle)),
           "--frames", "1", "--quiet", "--jsonl", str(jsonl), "--coverage" if coverage else "--no-coverage",
           "--coverage-load", "background" if background else "wait"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # A small interpreter spawns it and reports: a child forked from this process (torch loaded
    # for the exports) would count our memory as its peak until its exec.
    run = subprocess.run([sys.executable, "-c", SPAWNER, json.dumps(cmd)], capture_output=True, text=True, env=env)
    if run.returncode != 0 or not jsonl.is_file():
        raise SystemExit(f"edgecap run failed: {(run.stderr or run.stdout).strip().splitlines()[-1:]}")
    spawned = json.loads(run.stdout.strip().splitlines()[-1])
    t0, wall0 = spawned["t0"], spawned["wall0"]
    record = json.loads(jsonl.read_text().splitlines()[0])
    return {"caption_s": record["t_capture"] + record["capture_to_caption_ms"] / 1e3 - t0,
            "record_s": jsonl.stat().st_mtime - wall0, "exit_s": spawned["exit"] - t0,
            "peak_rss_mb": spawned["maxrss_kb"] / 1024, "coverage_on": "coverage" in record,
            "caption": record["caption"]}


# -- one start, from inside: where the time goes ----------------------------------------------
def stages_main(bundle: str, source: str, coverage: str) -> int:
    """`edgecap run`'s start-up steps in its order, each stamped (monotonic, seconds)."""
    stamps = {"start": time.monotonic()}
    if coverage in ("robot", "background"):
        sys.modules["torch"] = None
    from edgecap.contract.manifest import load_manifest
    from edgecap.runtime import command  # noqa: F401  (what `edgecap run` imports first)
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.scoring import CoverageAnnotator
    from edgecap.runtime.sources import make_source
    stamps["imports"] = time.monotonic()
    captioner = Captioner.from_bundle(bundle)  # manifest, file hashes, onnxruntime sessions
    stamps["bundle"] = time.monotonic()
    src = make_source(source)
    annotator = CoverageAnnotator(coverage != "off", log=lambda m: None, background=coverage == "background")
    stamps["make_source"] = time.monotonic()
    captioner.warm_up()
    stamps["warm_up"] = time.monotonic()
    annotator.warm_up()
    stamps["coverage"] = time.monotonic()
    src.open()
    captured = src.read()
    stamps["source"] = time.monotonic()
    caption = captioner.caption([captured.image])[0]
    stamps["caption"] = time.monotonic()
    annotator.score(caption.text, captured.objects)
    stamps["score"] = time.monotonic()
    load_manifest(Path(bundle))  # again, to say how much of "bundle" the manifest and hashes are
    stamps["manifest_s"] = time.monotonic() - stamps["score"]
    print(json.dumps(stamps))
    return 0


def stages_once(bundle: Path, variant: tuple) -> dict:
    """-> ms per step, and the ms from the spawn to the interpreter running our first line."""
    _, coverage, no_torch, background = variant
    mode = "background" if background else "robot" if no_torch else "on" if coverage else "off"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stages", str(bundle), SOURCE.format(size=frame_size(bundle)), mode]
    t0 = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise SystemExit(f"stages child failed: {run.stderr.strip().splitlines()[-1:]}")
    stamps = json.loads(run.stdout.strip().splitlines()[-1])
    ms = {"interpreter": (stamps["start"] - t0) * 1e3, "manifest": stamps["manifest_s"] * 1e3}
    previous = stamps["start"]
    for step in STEPS:
        ms[step] = (stamps[step] - previous) * 1e3
        previous = stamps[step]
    return ms


# -- the sweep -----------------------------------------------------------------------------------
def median_row(runs: list[dict], stages: list[dict]) -> dict:
    row = {k: statistics.median(r[k] for r in runs) for k in ("caption_s", "record_s", "exit_s", "peak_rss_mb")}
    row["caption_max_s"] = max(r["caption_s"] for r in runs)
    row.update({f"{k}_ms": statistics.median(s[k] for s in stages) for k in ("interpreter", *STEPS, "manifest")})
    row["coverage_on"] = all(r["coverage_on"] for r in runs)  # the first record scored
    row["runs"] = len(runs)
    return row


COLUMNS = [("bundle", "bundle", "s"), ("coverage", "coverage", "s"), ("caption_s", "first caption s", ".2f"),
           ("record_s", "first record s", ".2f"), ("exit_s", "exit s", ".2f"), ("peak_rss_mb", "peak RSS MB", ".0f"),
           ("interpreter_ms", "python", ".0f"), ("imports_ms", "imports", ".0f"), ("bundle_ms", "bundle", ".0f"),
           ("manifest_ms", "of it manifest", ".0f"), ("make_source_ms", "make source", ".0f"), ("warm_up_ms", "warm-up", ".0f"), ("coverage_ms", "coverage", ".0f"),
           ("source_ms", "source", ".0f"), ("caption_ms", "caption", ".0f"), ("score_ms", "score", ".0f")]


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join("-" if r.get(k) is None else format(r[k], spec) for k, _, spec in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


@one_line_errors
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.stages:
        return stages_main(*args.stages)
    from edgecap.io import write_text_atomic
    from edgecap.progress import progress_bar

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keep = bool(args.workdir)
    workdir = Path(args.workdir) if keep else Path(tempfile.mkdtemp(prefix="edgecap-startup-"))
    workdir.mkdir(parents=True, exist_ok=True)
    bundles = {"demo": demo_bundle, "real": real_bundle}
    rows = []
    try:
        made = {name: bundles[name](workdir) for name in args.bundles}
        todo = [(name, variant) for name in args.bundles for variant in VARIANTS]
        with progress_bar(total=len(todo), desc="startup", unit="row") as bar:
            for name, variant in todo:
                label, coverage = variant[:2]
                bar.set_postfix_str(f"{name} coverage {label}")
                if not args.quick:  # untimed: the page cache warm
                    run_once(made[name], variant, workdir)
                    stages_once(made[name], variant)
                runs = [run_once(made[name], variant, workdir) for _ in range(args.repeats)]
                stages = [stages_once(made[name], variant) for _ in range(args.repeats)]
                row = {"bundle": name, "coverage": label, **median_row(runs, stages),
                       "bundle_mb": sum(f.stat().st_size for f in made[name].iterdir() if f.is_file()) / 2**20}
                if coverage and not row["coverage_on"] and not variant[3]:  # background: unscored by design
                    row["coverage"] = f"{label} (off: no edgecap[nlp])"
                rows.append(row)
                bar.update()
    finally:
        if not keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    report = {"host": host_info(), "settings": {"repeats": args.repeats, "quick": args.quick},
              "load_1m": os.getloadavg()[0], "rows": rows}
    write_json(out / "startup.json", report)
    write_text_atomic(out / "startup.md", markdown(rows))
    print_table(rows, COLUMNS[:6])
    print(f"wrote {out / 'startup.json'}, startup.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
