"""benchmarks/soak.py --quick runs `edgecap run` with and without coverage, samples its resident
memory and reports the growth after warm-up, with a plot."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="samples /proc/PID/status")


def test_soak_benchmark_reports_growth_per_10k_frames_for_both_modes(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("spacy")
    from tests._export_util import cnn_bundle

    bundle = cnn_bundle(tmp_path)
    out = tmp_path / "soak"
    run = subprocess.run([sys.executable, f"{REPO}/benchmarks/soak.py", "--bundle", str(bundle), "--quick",
                          "--size", "32", "--out", str(out)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "MALLOC_ARENA_MAX": "2"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "kB / 10k frames" in run.stdout and "MB per 100k frames after warm-up" in run.stdout
    result = json.loads((out / "soak.json").read_text())
    assert result["allocator_env"] == {"MALLOC_ARENA_MAX": "2"}  # an A/B says which setting it had
    rows = result["rows"]
    assert [r["mode"] for r in rows] == ["coverage", "no coverage"]
    for row in rows:
        assert row["status"] == "ok" and row["frames"] == 240 and row["samples_fitted"] >= 3
        assert row["rss_end_mb"] > 10  # a Python process with onnxruntime: tens of MB at least
        assert row["kb_per_10k_frames"] == pytest.approx(row["bytes_per_frame"] * 10, abs=1)
    samples = (out / "soak_samples.csv").read_text().splitlines()
    assert samples[0] == "mode,seconds,frames,rss_bytes" and len(samples) > 6
    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for row in rows:  # growth per span of the run: what tells a filling cache from a leak
        spans = row["windows"]
        assert [(w["from_frame"], w["to_frame"]) for w in spans] == [(0, 48), (48, 96), (96, 144), (144, 192),
                                                                      (192, 240)]

    # the same samples fitted again with another warm-up, without running anything
    again = subprocess.run([sys.executable, f"{REPO}/benchmarks/soak.py", "--reanalyse", str(out), "--warmup", "120",
                            "--windows", "2"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    refit = json.loads((out / "soak.json").read_text())
    assert refit["args"]["warmup"] == 120 and refit["args"]["interval"] == 0.05  # the run's own, but the warm-up
    assert refit["allocator_env"] == {"MALLOC_ARENA_MAX": "2"}
    assert [[(w["from_frame"], w["to_frame"]) for w in r["windows"]] for r in refit["rows"]] == [[(0, 120), (120, 240)]] * 2
    assert all(r["warmup"] == 120 and r["rss_end_mb"] > 10 for r in refit["rows"])
    assert (out / "soak_samples.csv").read_text().splitlines() == samples  # the samples are kept as they were
    # --out OTHER: the refit goes there, samples included, and the run's own folder is left as it was
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    other = subprocess.run([sys.executable, f"{REPO}/benchmarks/soak.py", "--reanalyse", str(out), "--warmup", "60",
                            "--out", str(tmp_path / "refit")], capture_output=True, text=True, timeout=120)
    assert other.returncode == 0, other.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in (tmp_path / "refit").iterdir()) == ["soak.json", "soak.png", "soak_samples.csv"]
    assert json.loads((tmp_path / "refit" / "soak.json").read_text())["args"]["warmup"] == 60
    missing = subprocess.run([sys.executable, f"{REPO}/benchmarks/soak.py", "--reanalyse", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and f"cannot read {tmp_path / 'none' / 'soak.json'}" in missing.stderr
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "soak.json").write_text('{"a": 1}')
    foreign = subprocess.run([sys.executable, f"{REPO}/benchmarks/soak.py", "--reanalyse", str(tmp_path / "notes")],
                             capture_output=True, text=True, timeout=120)
    assert foreign.returncode == 2 and "lacks 'args' (with 'frames' and 'warmup') or 'rows'" in foreign.stderr
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["soak.json"]  # nothing written beside it


def _soak(*argv, cwd):
    return subprocess.run([sys.executable, f"{REPO}/benchmarks/soak.py", *map(str, argv)], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_soak_with_bad_arguments_gives_the_clis_one_line_errors(tmp_path):
    """Each was a traceback: a garbage samples file, --out naming a file, a --checkpoint that is not one."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    run = tmp_path / "run"
    run.mkdir()
    (run / "soak.json").write_text(json.dumps({"host": {}, "args": {"frames": 240, "warmup": 60},
                                               "rows": [{"mode": "coverage", "status": "ok"}]}))
    (run / "soak_samples.csv").write_text("garbage,stuff\n1,2\n")
    cases = [
        (["--reanalyse", run], 2, f"soak.py: error: --reanalyse: {run / 'soak_samples.csv'} is not soak.py's samples"),
        (["--out", notes, "--quick"], 2, f"soak.py: error: --out {notes} exists and is not a directory"),
        (["--checkpoint", tmp_path / "no.pt", "--quick", "--out", tmp_path / "o"], 2,
         f"soak.py: error: --checkpoint {tmp_path / 'no.pt'}: no such file"),
        (["--checkpoint", notes, "--quick", "--out", tmp_path / "o"], 1,
         f"soak.py: error: checkpoint {notes} is not a readable PyTorch file"),
    ]
    for argv, code, line in cases:
        done = _soak(*argv, cwd=tmp_path)
        assert done.returncode == code, done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1].startswith(line), done.stderr
        assert "Traceback" not in done.stderr
    (run / "soak_samples.csv").write_text("mode,seconds,frames,rss_bytes\nno coverage,0.1,5,1000\n")
    done = _soak("--reanalyse", run, cwd=tmp_path)
    assert done.returncode == 2 and "holds no samples of coverage, which soak.json lists as run" in done.stderr
    assert notes.read_text() == "my notes" and sorted(p.name for p in run.iterdir()) == ["soak.json", "soak_samples.csv"]
