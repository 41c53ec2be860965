"""Several cameras in one process: one batch per round, per-camera records and summary, and a
camera that fails or stalls while the others go on (`edgecap run --source A --source B`)."""

import io
import json
import re
import threading

import cv2
import numpy as np
import pytest
from runtime_helpers import FakeBundle, ScriptedSource, solid

from edgecap.errors import EdgecapError
from edgecap.runtime.camera import Backoff, FrameGrabber
from edgecap.runtime.captioner import Captioner
from edgecap.runtime.command import RunSettings, execute, settings_from_args
from edgecap.runtime.loop import Camera, LoopOptions, run_cameras
from edgecap.runtime.records import Summary
from edgecap.runtime.sources import EndOfStream, Source

RED, GREEN, BLUE = (0, 0, 255), (0, 255, 0), (255, 0, 0)  # BGR
CAPTION = {RED: "a red cup", GREEN: "a green cup", BLUE: "a blue cup"}


def _cameras(sources, pace="every", backoff=None):
    fresh = threading.Event()
    cameras = []
    for index, source in enumerate(sources):
        source.open()
        grabber = FrameGrabber(source, pace=pace, backoff=backoff or Backoff(), on_publish=lambda f: fresh.set())
        summary = Summary(source.name, camera=index)
        summary.grabber = grabber.stats
        cameras.append(Camera(index, grabber, summary))
    return cameras, fresh


def _run(sources, bundle, options=None, pace="every", backoff=None, coverage=None):
    cameras, fresh = _cameras(sources, pace, backoff)
    total = Summary(", ".join(s.name for s in sources), cameras=[c.summary for c in cameras])
    records, logged = [], []
    for camera in cameras:
        camera.grabber.start()
    try:
        run_cameras(Captioner(bundle), cameras, total, [records.append], options or LoopOptions(),
                    threading.Event(), fresh, coverage=coverage, log=logged.append)
    finally:
        for camera in cameras:
            camera.grabber.close()
    return records, total, logged


def _real_rows(batch):
    """The rows of a captioned batch that hold a frame (padding rows are all zero)."""
    return [row for row in batch if row.any()]


def test_each_round_is_one_batch_of_one_frame_per_camera():
    n = 5
    sources = [ScriptedSource([solid(c)] * n, name=name) for c, name in ((RED, "front"), (GREEN, "rear"),
                                                                        (BLUE, "wrist"))]
    bundle = FakeBundle(batch_size=3, delay=0.05)  # a slow round: every camera has a frame for the next
    records, total, _ = _run(sources, bundle)
    assert total.captioned == 3 * n
    # one visual call per round, never more frames of one camera than one in it
    assert len(bundle.seen_batches) == total.rounds
    assert total.rounds < total.captioned
    for batch in bundle.seen_batches:
        colours = [tuple(np.round(row.mean(axis=(1, 2)), 3)) for row in _real_rows(batch)]
        assert len(colours) == len(set(colours)) <= 3
    assert sum(len(_real_rows(b)) for b in bundle.seen_batches) == 3 * n  # padding is never a record
    # every camera's records are its own frames, in order, named by camera and source
    for index, (colour, name) in enumerate(((RED, "front"), (GREEN, "rear"), (BLUE, "wrist"))):
        mine = [r.to_json() for r in records if r.camera == index]
        assert [r["frame_id"] for r in mine] == list(range(n))
        assert {r["caption"] for r in mine} == {CAPTION[colour]}
        assert {(r["camera"], r["source"]) for r in mine} == {(index, name)}


def test_the_summary_counts_each_camera_and_the_total():
    from edgecap.runtime.sources import KnownObject

    cup = [KnownObject("cup", (0, 0, 5, 5), 0.2)]
    bottle = [KnownObject("bottle", (0, 0, 5, 5), 0.2)]
    sources = [ScriptedSource([(solid(RED), cup)] * 4, name="front"),
               ScriptedSource([(solid(GREEN), bottle)] * 2, name="rear")]
    from test_runtime_loop import _FakeScorer

    from edgecap.runtime.scoring import CoverageAnnotator

    _, total, _ = _run(sources, FakeBundle(batch_size=2), coverage=CoverageAnnotator(scorer=_FakeScorer()))
    s = total.to_json()
    assert s["frames_captioned"] == 6 and s["frames_captured"] == 6 and s["stopped_by"] == "end of source"
    front, rear = s["cameras"]
    assert (front["camera"], front["source"], front["frames_captioned"], front["frames_dropped"]) == (0, "front", 4, 0)
    assert (rear["camera"], rear["source"], rear["frames_captioned"]) == (1, "rear", 2)
    # "a red cup" names the front camera's cup; "a green cup" misses the rear camera's bottle
    assert front["coverage_mean"][">1%"] == 1.0 and rear["coverage_mean"][">1%"] == 0.0
    assert s["coverage_mean"][">1%"] == pytest.approx(4 / 6)
    assert front["capture_to_caption_ms"]["p99"] > 0 and rear["stopped_by"] == "end of source"
    text = total.human()
    assert "summary: 6 frames captioned" in text
    assert "camera 0 (front): 4 captioned, 0 dropped, 0 stalls" in text and "coverage >1% 100.0" in text
    assert "camera 1 (rear): 2 captioned" in text


def test_a_camera_that_is_lost_for_good_is_reported_and_the_others_go_on():
    n = 12
    lost = ScriptedSource([solid(RED), "lost", solid(RED)], name="rtsp://rear", fail_opens=10**6)
    steady = ScriptedSource([solid(GREEN)] * n, name="front")
    records, total, logged = _run([lost, steady], FakeBundle(batch_size=2, delay=0.02),
                                  backoff=Backoff(first=0.01, max_delay=0.02, give_up=0.05))
    by_camera = [[r.caption.text for r in records if r.camera == i] for i in (0, 1)]
    assert by_camera == [["a red cup"], ["a green cup"] * n]
    rear, front = total.to_json()["cameras"]
    assert rear["stopped_by"] == "source error" and front["stopped_by"] == "end of source"
    assert total.stopped_by == "end of source"
    assert any(m.startswith("camera 0 (rtsp://rear) failed: source rtsp://rear lost and not back") for m in logged)


class _Hangs(Source):
    """A camera whose driver hangs after its first frame until `release` is set."""

    def __init__(self):
        self.name, self.fps, self.live, self.timed = "usb-wrist", 20, False, False
        self.release = threading.Event()
        self.reads = 0

    def open(self):
        pass

    def read(self):
        from edgecap.runtime.sources import Captured

        self.reads += 1
        if self.reads == 1:
            return Captured(solid(BLUE), 0)
        self.release.wait(30)
        raise EndOfStream(self.name)


def test_a_stalled_camera_is_reported_and_does_not_hold_the_others_back():
    hangs = _Hangs()
    steady = ScriptedSource([solid(GREEN)] * 10, fps=20, name="front")
    records, logged = [], []
    cameras, fresh = _cameras([hangs, steady], pace="native")
    total = Summary("usb-wrist, front", cameras=[c.summary for c in cameras])
    for camera in cameras:
        camera.grabber.start()
    try:
        run_cameras(Captioner(FakeBundle(batch_size=2)), cameras, total, [records.append],
                    LoopOptions(frames=11), threading.Event(), fresh, stall_s=0.15, log=logged.append)
    finally:
        hangs.release.set()
        for camera in cameras:
            camera.grabber.close()
    assert [r.camera for r in records].count(1) == 10 and [r.camera for r in records].count(0) == 1
    wrist = total.to_json()["cameras"][0]
    assert wrist["stalls"] == 1 and total.to_json()["cameras"][1]["stalls"] == 0
    assert any(m.startswith("camera 0 (usb-wrist): no frame for") for m in logged)


def _folder(path, colours):
    path.mkdir()
    for i, c in enumerate(colours):
        cv2.imwrite(str(path / f"{i:03d}.png"), solid(c, size=20))
    return path


def _video(path, colours, fps=10):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (32, 32))
    for c in colours:
        writer.write(solid(c, size=32))
    writer.release()
    return path


def test_execute_captions_a_folder_and_a_video_that_ends_first(tmp_path):
    folder = _folder(tmp_path / "front", [RED] * 6)
    video = _video(tmp_path / "rear.mp4", [GREEN] * 2)
    out = io.StringIO()
    settings = RunSettings(source=[str(folder), str(video)], jsonl=str(tmp_path / "run.jsonl"), pace="every")
    summary, error = execute(Captioner(FakeBundle(batch_size=2)), settings, out=out)
    assert error is None
    recs = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert sorted((r["camera"], r["source"]) for r in recs) == [(0, str(folder))] * 6 + [(1, str(video))] * 2
    assert [r["image_id"] for r in recs if r["camera"] == 0] == [f"{i:03d}.png" for i in range(6)]
    assert {r["caption"] for r in recs if r["camera"] == 1} == {"a green cup"}
    saved = json.loads((tmp_path / "run.summary.json").read_text())
    assert saved["frames_captioned"] == 8 and saved["source"] == f"{folder}, {video}"
    assert [c["frames_captioned"] for c in saved["cameras"]] == [6, 2]
    assert "camera 1 (" in out.getvalue() and "[cam0      0]" in out.getvalue()


def test_execute_runs_on_when_one_camera_fails_and_says_which(tmp_path):
    """A folder image removed mid-run is skipped; a source whose reader breaks ends its camera
    with an error: the run finishes the others, then reports the failure (exit 1 from the CLI)."""
    folder = _folder(tmp_path / "front", [RED] * 5)
    broken = _folder(tmp_path / "rear", [GREEN] * 3)
    from edgecap.runtime import sources as sources_module

    real = sources_module.FolderSource.read

    def read(self):
        if self.name == str(broken) and getattr(self, "_reads", 0) >= 1:
            raise RuntimeError("disk unmounted")
        self._reads = getattr(self, "_reads", 0) + 1
        return real(self)

    sources_module.FolderSource.read = read
    try:
        summary, error = execute(Captioner(FakeBundle(batch_size=2)),
                                 RunSettings(source=[str(folder), str(broken)], quiet=True), out=io.StringIO())
    finally:
        sources_module.FolderSource.read = real
    assert error == f"camera 1 ({broken}): disk unmounted"
    front, rear = summary.to_json()["cameras"]
    assert front["frames_captioned"] == 5 and front["stopped_by"] == "end of source"
    assert rear["frames_captioned"] == 1 and rear["stopped_by"] == "source error"


def test_several_sources_from_flags_and_from_the_config(tmp_path):
    import argparse

    from edgecap.runtime.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    s = settings_from_args(parser.parse_args(["b", "--source", "0", "--source", "rtsp://rear/stream"]))
    assert s.source == ["0", "rtsp://rear/stream"]
    assert settings_from_args(parser.parse_args(["b", "--source", "0"])).source == "0"  # one: unchanged
    (tmp_path / "front").mkdir()
    cfg = tmp_path / "run.toml"
    cfg.write_text('bundle = "b"\nsource = ["front", "2", "synth://tabletop"]\n')
    got = settings_from_args(parser.parse_args(["--config", str(cfg)])).source
    assert got == [str(tmp_path / "front"), "2", "synth://tabletop"]
    cfg.write_text('bundle = "b"\nsource = ["0", 1]\n')
    with pytest.raises(EdgecapError, match=r"source = \['0', 1\]: expected a string in quotes or a list of them"):
        settings_from_args(parser.parse_args(["--config", str(cfg)]))


@pytest.mark.parametrize("extra, message", [
    ({"save_video": "x.mp4"}, "--save-video follows one camera; with 2 sources"),
    ({"detections": "d.jsonl"}, "--detections follows one camera"),
    ({"batch": 2}, "--batch 2 applies to one source; with 2 sources each round batches one frame of every camera"),
])
def test_options_that_follow_one_camera_are_refused_with_several(tmp_path, extra, message):
    settings = RunSettings(source=["synth://tabletop", "synth://tabletop?seed=2"], **extra)
    with pytest.raises(EdgecapError, match=message):
        execute(Captioner(FakeBundle(batch_size=2)), settings, out=io.StringIO())


def test_the_same_source_twice_is_refused():
    with pytest.raises(EdgecapError, match=r"--source synth://tabletop is given twice \(as synth://tabletop\?seed=0&"
                                           r"size=128&fps=15&scene=4\); each camera once"):
        execute(Captioner(FakeBundle()), RunSettings(source=["synth://tabletop", "synth://tabletop"]),
                out=io.StringIO())


def _two_spellings(tmp_path, kind):
    import os

    if kind == "folder with and without its slash":
        folder = tmp_path / "frames"
        folder.mkdir()
        cv2.imwrite(str(folder / "a.png"), solid((0, 0, 255)))
        return [str(folder), f"{folder}/"]
    if kind == "a video and a symlink to it":
        video = tmp_path / "clip.mp4"
        writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10, (24, 24))
        writer.write(solid((0, 0, 255)))
        writer.release()
        os.symlink(video, tmp_path / "link.mp4")
        return [str(video), str(tmp_path / "link.mp4")]
    if kind == "synth with and without its default seed":
        return ["synth://tabletop", "synth://tabletop?seed=0"]
    return ["0", "00"]


@pytest.mark.parametrize("kind", ["folder with and without its slash", "a video and a symlink to it",
                                  "synth with and without its default seed", "camera index written twice"])
def test_one_camera_under_two_spellings_is_refused_not_captioned_twice(tmp_path, kind):
    first, second = _two_spellings(tmp_path, kind)
    bundle = FakeBundle()
    with pytest.raises(EdgecapError, match=f"--source {re.escape(second)} is given twice"):
        execute(Captioner(bundle), RunSettings(source=[first, second]), out=io.StringIO())
    assert bundle.seen_batches == []


def test_two_different_synthetic_worlds_are_two_cameras():
    from edgecap.runtime.sources import source_identity

    assert source_identity("synth://tabletop?seed=1") != source_identity("synth://tabletop")
    assert source_identity("rtsp://admin:pw@CAM.local/Stream") == source_identity("RTSP://admin:pw@cam.local/Stream")
    assert source_identity("rtsp://cam.local/Stream") != source_identity("rtsp://cam.local/stream")  # paths keep case
