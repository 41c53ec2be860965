"""benchmarks/fleet.py --quick: `edgecap run` and `edgecap fleet` over the same synthetic robot
logs, both summaries read, the comparison written as JSON, a table and a PNG."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_fleet_benchmark_quick(tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    pytest.importorskip("mcap_ros2")
    pytest.importorskip("matplotlib")
    from tests._export_util import cnn_bundle

    bundle = cnn_bundle(tmp_path)
    run = subprocess.run([sys.executable, f"{REPO}/benchmarks/fleet.py", "--quick", "--bundle", str(bundle),
                          "--out", str(tmp_path / "results")], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "results" / "fleet.json").read_text())
    rows = {r["configuration"]: r for r in result["rows"]}
    assert set(rows) == {"run, 1 thread", "fleet 1 actor x 1 thread"}
    assert all(r["status"] == "ok" and r["captions"] == 24 and r["captions_per_s"] > 0 for r in rows.values())
    fleet = rows["fleet 1 actor x 1 thread"]
    assert fleet["against"] == "run, 1 thread" and fleet["vs_run"] > 0 and fleet["per_actor_busy_s"] > 0
    assert "| fleet 1 actor x 1 thread |" in (tmp_path / "results" / "fleet.md").read_text()
    assert (tmp_path / "results" / "fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
