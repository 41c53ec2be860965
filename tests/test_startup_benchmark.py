"""benchmarks/startup.py --quick: `edgecap run` started fresh, timed to its first caption, with and
without coverage, and its start-up steps stamped."""

import json
import subprocess
import sys

from tests.conftest import REPO


def test_startup_quick_times_the_first_caption_and_the_memory(tmp_path):
    out = tmp_path / "startup"
    run = subprocess.run([sys.executable, f"{REPO}/benchmarks/startup.py", "--quick", "--out", str(out),
                          "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {r["coverage"].removesuffix(" (off: no edgecap[nlp])"): r for r in json.loads((out / "startup.json").read_text())["rows"]}
    assert set(rows) == {"off", "on", "on, no torch", "background, no torch"}
    for row in rows.values():
        assert row["bundle"] == "demo" and row["runs"] == 1
        # the caption exists before the process ends, and the process is more than its interpreter
        assert 0 < row["interpreter_ms"] / 1e3 < row["caption_s"] <= row["exit_s"]
        assert 20 < row["peak_rss_mb"] < 4000
        steps = sum(row[f"{s}_ms"] for s in ("imports", "bundle", "make_source", "warm_up", "coverage", "source", "caption"))
        assert steps > 0 and row["bundle_ms"] >= row["manifest_ms"] > 0
    assert rows["off"]["coverage_ms"] < rows["on"]["coverage_ms"] or rows["on"]["coverage"] != "on"
    assert "| demo | off |" in (out / "startup.md").read_text()
    # loading the scorer in the background: the first caption goes out unscored, without waiting
    assert rows["background, no torch"]["coverage_on"] is False
    assert rows["on"]["coverage_on"] is True or rows["on"]["coverage"].endswith("(off: no edgecap[nlp])")


def test_startup_with_bad_arguments_gives_the_clis_one_line_errors(tmp_path):
    """--out FILE and --workdir FILE were tracebacks; --bundles , wrote an empty result with exit 0."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    for argv, line in ((["--out", notes], f"--out {notes} exists and is not a directory"),
                       (["--workdir", notes, "--out", tmp_path / "o"], f"--workdir {notes} exists and is not a directory"),
                       (["--bundles", ",", "--out", tmp_path / "o"], "--bundles names no bundle; choose from demo, real")):
        done = subprocess.run([sys.executable, f"{REPO}/benchmarks/startup.py", *map(str, argv)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [
            f"startup.py: error: {line}; name a folder for the results (see startup.py --help)"
            if "exists" in line else f"startup.py: error: {line} (see startup.py --help)"], done.stderr
    assert notes.read_text() == "my notes" and not (tmp_path / "o").exists()
