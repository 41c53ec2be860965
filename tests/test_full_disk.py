"""A disk that fills up under any writer (issue 41): one line naming the output and the free
space, exit 1, nothing under the output's final name, no work directory left behind, and a
caption log whose records stay whole and end with a line saying the run was cut short (as a
run cut short by a second Ctrl-C does).

Each command runs with its output on a real, small tmpfs, mounted in a private mount namespace
(`unshare -m`, or `unshare -rm` without root), so the file system itself says ENOSPC; its
contents are copied out before the namespace goes. Where no namespace can be made, those tests
skip, and the writes are made to fail with ENOSPC in-process instead (the tests after them)."""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from edgecap.errors import EdgecapError
from tests.conftest import REPO

FULL = re.compile(r"cannot write (--\S+ )?(?P<target>\S+): No space left on device \((?P<free>[\d.]+ [kMGT]?B) free on \S+\)")


@functools.cache
def _namespace() -> list[str] | None:
    """The unshare command that gives this user a mount namespace where tmpfs can be mounted."""
    if not shutil.which("unshare"):
        return None
    for cmd in (["unshare", "-m"], ["unshare", "-rm"]):
        try:
            probe = subprocess.run([*cmd, "sh", "-c", 'd=$(mktemp -d) && mount -t tmpfs -o size=16k tmpfs "$d"'],
                                   capture_output=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return cmd
    return None


def on_small_disk(tmp_path, size: str, *argv):
    """Run `edgecap ARGV` with `tmp_path/disk` a tmpfs of `size`; -> (exit code, stdout, stderr,
    what the disk held when it ended, copied to `tmp_path/after`)."""
    namespace = _namespace()
    if namespace is None:
        pytest.skip("no mount namespace for a small tmpfs here (unshare -m / -rm refused); "
                    "the in-process ENOSPC tests below cover the writers")
    disk, after = tmp_path / "disk", tmp_path / "after"
    disk.mkdir()
    after.mkdir()
    script = ('mount -t tmpfs -o size="$0" tmpfs "$DISK" || exit 97; "$@"; rc=$?; '
              'cp -a "$DISK/." "$AFTER"; exit $rc')
    env = {**os.environ, "PYTHONPATH": REPO, "DISK": str(disk), "AFTER": str(after), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*namespace, "sh", "-c", script, size, sys.executable, "-m", "edgecap",
                           *map(str, argv)], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode != 97, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr, after


def one_line_full(err: str, target) -> re.Match:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    match = FULL.search(lines[0])
    assert match, lines[0]
    assert match["target"] == str(target), lines[0]
    return match


def leftovers(after) -> list[str]:
    return sorted(str(p.relative_to(after)) for p in after.rglob("*"))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    pytest.importorskip("torch")
    from tests._export_util import cnn_bundle

    return cnn_bundle(tmp_path_factory.mktemp("full-disk"))


def test_export_onto_a_full_disk(bundle, tmp_path):
    code, _, err, after = on_small_disk(tmp_path, "200k", "export", bundle.parent / "tiny.pt", "--engine", "onnx",
                                        "--samples", 2, "--out", tmp_path / "disk" / "out" / "bundle", "--quiet")
    assert code == 1
    one_line_full(err, tmp_path / "disk" / "out" / "bundle")
    assert leftovers(after) == []  # no bundle, no work directory, not even the folder made for it


def test_run_jsonl_onto_a_full_disk_keeps_whole_records_and_says_it_was_cut_short(bundle, tmp_path):
    jsonl = tmp_path / "disk" / "r.jsonl"
    code, _, err, after = on_small_disk(tmp_path, "64k", "run", bundle, "--source", "synth://tabletop?size=32&fps=500",
                                        "--jsonl", jsonl, "--quiet")
    assert code == 1
    match = one_line_full(err, jsonl)
    lines = (after / "r.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b""  # ends with a newline: no half line
    records = [json.loads(line) for line in lines[:-1]]  # every line whole
    *captions, last = records
    assert len(captions) > 5 and all("caption" in r for r in captions)
    assert last["kind"] == "run_end" and last["cut_short"] is True
    assert last["stopped_by"].startswith(f"error: cannot write --jsonl {jsonl}: No space left on device")
    assert f"the {len(captions)} records written before it are whole" in err and match["free"]
    assert leftovers(after) == ["r.jsonl"]  # its claim is gone, and no summary file was half-written


def test_run_save_video_onto_a_full_disk_is_an_error_not_a_video_that_does_not_open(bundle, tmp_path):
    video = tmp_path / "disk" / "v.mp4"
    code, stdout, err, after = on_small_disk(tmp_path, "100k", "run", bundle, "--source",
                                             "synth://tabletop?size=96&fps=200", "--frames", 80,
                                             "--save-video", video, "--quiet")
    assert code == 1, stdout + err  # was exit 0 and "video: v.mp4", a file with no moov atom
    one_line_full(err, video)
    assert "video:" not in stdout and leftovers(after) == []


def test_train_onto_a_full_disk(world, tmp_path):
    pytest.importorskip("torch")
    from _train_tiny import tiny_config

    from edgecap.train.config import to_toml

    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(tiny_config(world).to_dict()))
    run = tmp_path / "disk" / "run"
    code, _, err, after = on_small_disk(tmp_path, "600k", "train", "--config", config, "--out", run, "--quiet")
    assert code == 1  # was "RuntimeError: [enforce fail at inline_container.cc:672]"
    match = one_line_full(err, FULL.search(err)["target"])
    assert match["target"].startswith(f"{run}/") and match["target"].endswith(".pt")
    name = os.path.basename(match["target"])
    assert name not in os.listdir(after / "run")  # no partial file under the checkpoint's name
    assert not [n for n in leftovers(after) if "edgecap-tmp" in n]
    assert [json.loads(line) for line in (after / "run" / "metrics.jsonl").read_text().splitlines()]  # whole lines


@pytest.fixture(scope="module")
def caption_log(bundle, tmp_path_factory):
    from edgecap.cli import main

    log = tmp_path_factory.mktemp("log") / "r.jsonl"
    assert main(["run", str(bundle), "--source", "synth://tabletop?size=32&fps=500", "--frames", "20",
                 "--jsonl", str(log), "--quiet"]) == 0
    return log


@pytest.mark.parametrize("size", ["8k", "60k"])  # fails at the work directories / at the report or a chart
def test_eval_coverage_out_onto_a_full_disk_leaves_no_folder(caption_log, tmp_path, size):
    pytest.importorskip("spacy")
    out = tmp_path / "disk" / "eval"
    code, _, err, after = on_small_disk(tmp_path, size, "eval", "coverage", "--records", caption_log,
                                        "--out", out, "--quiet")
    assert code == 1
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"edgecap eval: error: cannot write --out {out}") and FULL.search(line), err
    assert leftovers(after) == []  # was an empty folder


def test_index_build_onto_a_full_disk(world, tmp_path):
    pytest.importorskip("faiss")
    h5py = pytest.importorskip("h5py")
    doc = json.loads((world / "dataset_coco.json").read_text())
    features = tmp_path / "f.h5"
    rng = np.random.default_rng(0)
    with h5py.File(features, "w") as f:
        for im in doc["images"]:
            f.create_dataset(f"{im['cocoid']}_features", data=rng.random((8, 256), dtype=np.float32))
    out = tmp_path / "disk" / "index"
    code, _, err, after = on_small_disk(tmp_path, "24k", "index", "build", "--features", features, "--split-file",
                                        world / "dataset_coco.json", "--out", out, "--quiet")
    assert code == 1
    one_line_full(err, out)
    assert leftovers(after) == []


# -- the same writers, their writes made to fail with ENOSPC in-process ------------------------
class FillsUp:
    """An unbuffered file that takes `room` more bytes and then fails as a full disk does: a
    short write, then OSError(ENOSPC). Deleting the file `freeing` (on the same disk) gives its
    `size` bytes back."""

    def __init__(self, fh, room: int, freeing=None, size: int = 0):
        self.fh, self.room, self.freeing, self.size = fh, room, freeing, size

    def write(self, data) -> int:
        if self.freeing is not None and not self.freeing.exists():
            self.room, self.freeing = self.room + self.size, None
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(data), self.room)
        self.room -= n
        return self.fh.write(data[:n])

    def __getattr__(self, name):
        return getattr(self.fh, name)


def _record(frame_id: int = 0, caption: str = "a cup on a table"):
    from edgecap.runtime.camera import Frame
    from edgecap.runtime.captioner import Caption
    from edgecap.runtime.records import Record

    return Record(Frame(np.zeros((32, 32, 3), np.uint8), frame_id, 0.0, 0.0), Caption(caption, [5]), "cam", 0.0)


def _caption_log(tmp_path, append=False):
    """`edgecap run --jsonl`'s sink, opened as a run opens it: -> (ExitStack, write, log path)."""
    import contextlib
    import threading

    from edgecap.runtime.command import RunSettings
    from edgecap.runtime.records import Summary
    from edgecap.runtime.run_sinks import RunContext, jsonl_sink

    log = tmp_path / "r.jsonl"
    closing = contextlib.ExitStack()
    write = jsonl_sink(closing, RunSettings(source="cam", jsonl=str(log), append=append),
                       RunContext(Summary("cam"), threading.Event()))
    return closing, write, log


def test_a_caption_log_whose_disk_fills_keeps_whole_records_and_ends_cut_short(tmp_path, monkeypatch):
    from edgecap.runtime import records

    line = len(json.dumps(_record().to_json(), ensure_ascii=False)) + 1

    class FillingWriter(records.JsonlWriter):  # the disk has room for 3 records and a bit
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._fh = FillsUp(self._fh, 3 * line + line // 2, self._reserve, records.RESERVE_BYTES)

    monkeypatch.setattr(records, "JsonlWriter", FillingWriter)
    closing, write, log = _caption_log(tmp_path)
    with pytest.raises(EdgecapError) as info, closing:
        for i in range(8):
            write(_record(i))
    message = str(info.value)
    assert message.startswith(f"cannot write --jsonl {log}: No space left on device (") and " free on " in message
    assert message.endswith("the 3 records written before it are whole")
    lines = log.read_text().splitlines()
    assert [json.loads(x)["frame_id"] for x in lines[:3]] == [0, 1, 2]  # whole: the half fourth was cut off
    last = json.loads(lines[3])
    assert len(lines) == 4 and last["cut_short"] is True and last["stopped_by"] == f"error: {message}"
    assert list(tmp_path.iterdir()) == [log]  # the claim (and its reserve) gone


def test_two_sigints_that_cut_a_run_short_leave_a_last_line_saying_so(tmp_path):
    """A second Ctrl-C interrupts at once (exit 130); when it escapes the loop, the caption log's
    last line says so, with the summary so far, for `eval coverage --records`."""
    for append in (False, True):
        closing, write, log = _caption_log(tmp_path, append)
        with pytest.raises(KeyboardInterrupt), closing:
            write(_record())
            raise KeyboardInterrupt
        last = json.loads(log.read_text().splitlines()[-1])
        assert (last["kind"], last["stopped_by"], last["cut_short"]) == ("run_end", "interrupted (SIGINT)", True)
        assert "frames_captioned" in last and "coverage_mean" in last


@pytest.mark.parametrize("gap", [0.001, 0.03])
def test_two_sigints_to_a_real_run_end_it_in_order_or_say_it_was_interrupted(bundle, tmp_path, gap):
    """Ctrl-C twice, `gap` seconds apart, to a real `edgecap run`: where the second lands (in the
    loop, while the outputs close, while the summary is written) decides between exit 0 with a
    summary and exit 130, but never a traceback or a half line, and a log whose last line is a
    run_end says why the run ended. (A second signal during the summary's write was a
    FileNotFoundError traceback: the work directory's removal ran twice.)"""
    import signal
    import time

    jsonl = tmp_path / "r.jsonl"
    for _ in range(3):
        jsonl.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "edgecap", "run", str(bundle), "--source",
                                 "synth://tabletop?size=32&fps=200", "--jsonl", str(jsonl), "--quiet"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": REPO}, cwd=tmp_path)
        deadline = time.monotonic() + 120
        while not (jsonl.exists() and jsonl.read_text().count("\n") >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        time.sleep(gap)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, 130) and "Traceback" not in err, err
        text = jsonl.read_text()
        assert text.endswith("\n")
        records = [json.loads(line) for line in text.splitlines()]  # every line whole
        if proc.returncode == 0:
            assert "summary:" in out
            assert json.loads((tmp_path / "r.summary.json").read_text())["stopped_by"] == "signal"
        else:
            assert err.strip().splitlines()[-1] == "edgecap run: interrupted"
        if records[-1].get("kind") == "run_end":
            assert records[-1]["stopped_by"] == "interrupted (SIGINT)" and records[-1]["cut_short"] is True
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no work directory


def test_eval_coverage_reports_a_cut_short_run_as_cut_short(tmp_path, capsys):
    pytest.importorskip("spacy")
    from edgecap.cli import main

    closing, write, log = _caption_log(tmp_path)
    with pytest.raises(KeyboardInterrupt), closing:
        write(type("R", (), {"to_json": lambda self: {"frame_id": 0, "source": "cam", "caption": "a cup",
                                                     "objects": [{"class": "cup", "box": [0, 0, 9, 9], "area": 0.2}]}})())
        raise KeyboardInterrupt
    assert main(["eval", "coverage", "--records", str(log), "--no-plot"]) == 0
    assert "cut short: interrupted (SIGINT)" in capsys.readouterr().out


def test_a_checkpoint_written_to_a_full_disk_is_one_line(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import builtins

    from edgecap.models import checkpoint

    # every write fails with ENOSPC, and torch's zip writer then fails again while closing
    monkeypatch.setattr(checkpoint, "open", lambda _path, mode: builtins.open("/dev/full", mode), raising=False)
    with pytest.raises(EdgecapError) as info:
        checkpoint.save_payload({"w": torch.zeros(1000)}, tmp_path / "runs" / "last.pt")
    assert FULL.search(str(info.value))["target"] == str(tmp_path / "runs" / "last.pt")
    assert list(tmp_path.iterdir()) == []  # nor the runs/ folder made for it


def test_a_retrieval_index_written_to_a_full_disk_is_one_line(tmp_path, monkeypatch):
    faiss = pytest.importorskip("faiss")
    import builtins

    from edgecap.retrieval import index as index_module

    flat = faiss.IndexFlatIP(8)
    flat.add(np.ones((4, 8), np.float32))
    monkeypatch.setattr(index_module, "open", lambda _path, mode: builtins.open("/dev/full", mode), raising=False)
    table = index_module.CaptionIndex(flat, ["1", "2", "3", "4"], [["a"]] * 4, np.zeros((4, 1), np.int64),
                                      {"format": index_module.FORMAT})
    with pytest.raises(EdgecapError) as info:
        table.save(tmp_path / "index")
    assert FULL.search(str(info.value))["target"] == str(tmp_path / "index")
    assert list(tmp_path.iterdir()) == []


def test_a_video_whose_frames_ffmpeg_cannot_write_is_not_published(tmp_path, monkeypatch):
    import cv2

    from edgecap.runtime.overlay import VideoSink

    class FullDiskWriter:  # OpenCV 5's VideoWriter.write returns False when FFmpeg could not write
        def __init__(self, *args):
            pass

        def isOpened(self):
            return True

        def write(self, frame):
            return False

        def release(self):
            pass

    monkeypatch.setattr(cv2, "VideoWriter", FullDiskWriter)
    video = tmp_path / "v.mp4"
    sink = VideoSink(video)
    with pytest.raises(EdgecapError, match=rf"cannot write --save-video {re.escape(str(video))}: OpenCV's writer "
                                           r"failed at frame 0; no video written \(.* free on .*\)"):
        sink.write(_record())
    sink.close()
    assert list(tmp_path.iterdir()) == []


def test_a_video_that_does_not_read_back_whole_is_not_published(tmp_path, monkeypatch):
    """OpenCV 4's writer returns nothing from write(): the finished file is read back instead."""
    from edgecap.runtime import overlay

    video = tmp_path / "v.mp4"
    sink = overlay.VideoSink(video)
    for i in range(3):
        sink.write(_record(i))
    sink.count += 2  # as if two frames had been handed to a writer that dropped them
    with pytest.raises(EdgecapError, match=r"the finished video holds 3 of its 5 frames \(FFmpeg could not write "
                                           r"it whole\)"):
        sink.close()
    assert list(tmp_path.iterdir()) == []
