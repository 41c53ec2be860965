"""One writer per output: a second `edgecap run` writing the same --jsonl (with or without
--append) or --out-mcap is refused in one line naming the first process, and the first
run's file is left whole. Two real processes."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_helpers import hidden_leftovers

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from tests._export_util import cnn_bundle

    return cnn_bundle(tmp_path_factory.mktemp("writer"))


def _edgecap(*argv) -> list[str]:
    return [sys.executable, "-m", "edgecap", *map(str, argv)]


def _start_first(argv, ready) -> subprocess.Popen:
    """Start the first writer and wait until `ready()` says it is writing."""
    proc = subprocess.Popen(_edgecap(*argv), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first run never started writing"
        time.sleep(0.05)
    return proc


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _second_writer_refused(bundle, first_outputs, second_outputs, log: Path) -> tuple[int, list[str]]:
    """Start a run writing `first_outputs` (its records in `log`); once it is writing, run a second
    one writing `second_outputs`, then stop the first with SIGTERM. The second must exit 1, the
    first 0 (it stops in order on its first SIGTERM). -> (the first's pid, the second's stderr lines)"""
    first = _start_first(["run", bundle, "--source", "synth://tabletop?seed=1&size=32", "--pace", "every",
                          *first_outputs, "--quiet"], lambda: len(_lines(log)) >= 3)
    try:
        second = subprocess.run(_edgecap("run", bundle, "--source", "synth://tabletop?seed=2&size=32",
                                         "--frames", 5, *second_outputs, "--quiet"),
                                cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        first.send_signal(signal.SIGTERM)
        _, first_err = first.communicate(timeout=60)
    assert second.returncode == 1, second.stderr
    assert first.returncode == 0, first_err
    return first.pid, second.stderr.strip().splitlines()


@pytest.mark.parametrize("append", [False, True], ids=["replace", "append"])
def test_a_second_run_on_the_same_jsonl_is_refused_naming_the_first(bundle, tmp_path, append):
    log = tmp_path / "r.jsonl"
    outputs = ["--jsonl", log, *(["--append"] if append else [])]
    pid, err = _second_writer_refused(bundle, outputs, outputs, log)
    assert len(err) == 1, err
    assert f"--jsonl {log} is being written by another process (pid {pid}: edgecap run " in err[0]
    lines = _lines(log)
    records = [json.loads(line) for line in lines]  # every line whole: no NUL bytes, no torn line
    assert "\0" not in log.read_text()
    captions = [r for r in records if "caption" in r]
    assert captions and {r["source"] for r in captions} == {"synth://tabletop?seed=1&size=32"}
    assert hidden_leftovers(tmp_path) == []


def test_a_second_run_on_the_same_mcap_is_refused_and_the_first_finishes_it(bundle, tmp_path):
    pytest.importorskip("mcap")
    out = tmp_path / "c.mcap"
    log = tmp_path / "first.jsonl"
    pid, err = _second_writer_refused(bundle, ["--out-mcap", out, "--jsonl", log], ["--out-mcap", out], log)
    assert len(err) == 1 and f"is being written by another process (pid {pid}:" in err[0], err
    from mcap.reader import make_reader

    with out.open("rb") as fh:
        captions = [m for _s, ch, m in make_reader(fh).iter_messages() if ch.topic == "/edgecap/caption"]
    assert len(captions) == len([r for r in map(json.loads, _lines(log)) if "caption" in r])
    assert hidden_leftovers(tmp_path) == []


def test_a_dead_writers_claim_does_not_block_the_next_run(bundle, tmp_path):
    log = tmp_path / "r.jsonl"
    first = _start_first(["run", bundle, "--source", "synth://tabletop?seed=1&size=32", "--pace", "every",
                          "--jsonl", log, "--quiet"], lambda: len(_lines(log)) >= 2)
    first.kill()
    first.communicate()
    assert hidden_leftovers(tmp_path)  # SIGKILL: its claim is left behind
    second = subprocess.run(_edgecap("run", bundle, "--source", "synth://tabletop?seed=2&size=32", "--frames", 3,
                                     "--jsonl", log, "--append", "--quiet"),
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "left by an interrupted write of r.jsonl" in second.stderr
    assert [p for p in hidden_leftovers(tmp_path) if p.endswith(".edgecap-tmp")] == []


def test_a_second_run_saving_the_same_video_is_refused_and_the_first_finishes_it(bundle, tmp_path):
    pytest.importorskip("cv2")
    import cv2

    video = tmp_path / "clip.mp4"
    log = tmp_path / "first.jsonl"
    pid, err = _second_writer_refused(bundle, ["--save-video", video, "--jsonl", log], ["--save-video", video], log)
    assert len(err) == 1, err
    assert f"--save-video {video} is being written by another process (pid {pid}: edgecap run " in err[0]
    captions = [r for r in map(json.loads, _lines(log)) if "caption" in r]
    capture = cv2.VideoCapture(str(video))
    try:
        assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == len(captions)  # the first run's video, whole
    finally:
        capture.release()
    assert hidden_leftovers(tmp_path) == []
