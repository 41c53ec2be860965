"""benchmarks/log_read.py --quick writes logs in every storage and times each reader on them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_log_read_benchmark_quick(tmp_path):
    pytest.importorskip("rosbags")
    pytest.importorskip("mcap_ros2")
    run = subprocess.run([sys.executable, f"{REPO}/benchmarks/log_read.py", "--quick",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = json.loads((tmp_path / "log_read.json").read_text())["rows"]
    cells = {(r["storage"], r["message"], r["reader"]) for r in rows}
    assert ("rosbag2 sqlite3", "Image", "rosbags") in cells          # only rosbags reads SQLite3
    assert ("rosbag2 sqlite3", "Image", "mcap") not in cells
    assert ("rosbag2 sqlite3", "Image", "rosbags AnyReader") in cells  # the reader it replaced, beside it
    assert {("mcap file", "CompressedImage", r) for r in ("mcap", "rosbags")} <= cells
    assert all(r["ms_per_image"] > 0 and r["vs_fastest"] >= 1.0 for r in rows)
    assert "| rosbag2 mcap | Image | mcap |" in (tmp_path / "log_read.md").read_text()
