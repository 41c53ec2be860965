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
