"""What a user gets from `pip install edgecap` without a checkout: the wheel built from this
tree, installed into a fresh venv, finds what the docs tell them to use."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_an_installed_wheel_finds_the_export_target_presets(tmp_path):
    """`edgecap export CKPT --target cpu-ort-fp32` outside the checkout: the presets ship."""
    source = tmp_path / "source"  # setuptools builds in the source tree: not in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("edgecap", "export"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    str(source), "-w", str(tmp_path / "wheel")], check=True, capture_output=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    wheel = next((tmp_path / "wheel").glob("edgecap-*.whl"))
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([python, "-c", "from edgecap.export.formats import list_presets, load_preset\n"
                           "print(sorted(list_presets())); print(load_preset('cpu-ort-fp32')[1])"],
                          capture_output=True, text=True, cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    names, options = done.stdout.splitlines()
    assert names == str(sorted(p.stem for p in (REPO / "export").glob("*.toml")))
    assert "'engine': 'onnx'" in options
    # the ROS 2 node's systemd unit and parameters file ship too (robot/README.md installs them)
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the wheel's copy, not a checkout's
    done = subprocess.run([python, "-m", "edgecap", "ros2", "--share"], capture_output=True, text=True,
                          cwd=elsewhere, env=alone)
    assert done.returncode == 0, done.stderr
    share = Path(done.stdout.strip())
    assert sorted(p.name for p in share.iterdir() if p.name != "__pycache__") == [
        "edgecap-ros2.service", "edgecap-ros2.yaml",
        "edgecap_ros2.launch.py"]
    assert str(share).startswith(str(venv))
