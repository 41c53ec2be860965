"""Fast start: with --coverage-load background the first caption does not wait for spaCy and
GloVe; captions finished while they load go out unscored and are counted."""

import argparse
import threading
import time

from runtime_helpers import FakeBundle, ScriptedSource, solid
from test_runtime_loop import _FakeScorer

from edgecap.runtime.camera import FrameGrabber
from edgecap.runtime.captioner import Captioner
from edgecap.runtime.command import RunSettings, add_arguments, settings_from_args
from edgecap.runtime.execute import coverage_in_background
from edgecap.runtime.loop import LoopOptions, run_loop
from edgecap.runtime.records import Summary
from edgecap.runtime.scoring import CoverageAnnotator
from edgecap.runtime.sources import KnownObject

RED = (0, 0, 255)
CUP = [KnownObject("cup", (0, 0, 5, 5), 0.2)]


class _SlowAnnotator(CoverageAnnotator):
    """spaCy and GloVe taking `seconds` to load."""

    def __init__(self, seconds, **kw):
        super().__init__(**kw)
        self.seconds, self.loads = seconds, []

    def _load(self):
        if self._scorer is None:
            self.loads.append(threading.current_thread().name)
            time.sleep(self.seconds)
            self._scorer = _FakeScorer()
        return self._scorer


def _run(annotator, frames=12, fps=40):
    source = ScriptedSource([(solid(RED), CUP)] * frames, fps=fps)
    source.open()
    records, summary = [], Summary("scripted")
    with FrameGrabber(source, pace="native") as grabber:
        annotator.warm_up()
        t0 = time.monotonic()
        run_loop(Captioner(FakeBundle()), grabber, summary, [records.append], LoopOptions(),
                 threading.Event(), coverage=annotator)
    summary.coverage_unscored = annotator.unscored
    return records, summary, records[0].t_done - t0


def test_background_loading_captions_first_and_scores_once_loaded():
    annotator = _SlowAnnotator(0.15, background=True)
    records, summary, first = _run(annotator)
    assert first < 0.15  # the first caption did not wait for the scorer
    scored = [r.coverage is not None for r in records]
    # the first captions went out unscored, every later one is scored
    assert scored[0] is False and scored[-1] is True and scored == sorted(scored)
    assert annotator.loads == ["edgecap-coverage-load"]
    assert summary.to_json()["coverage_unscored"] == scored.count(False) == annotator.unscored
    assert summary.to_json()["coverage_frames"][">1%"] == scored.count(True)
    assert f"{scored.count(False)} captions not scored: finished while the coverage scorer was loading" in summary.human()


def test_closing_waits_for_a_load_still_running():
    """A run that ends before the scorer is loaded (`--frames 1`) joins the loading thread:
    an interpreter exiting while a thread imports spaCy can abort with a fatal error."""
    annotator = _SlowAnnotator(0.3, background=True)
    assert annotator.score("a red cup", CUP) is None
    assert annotator._loader.is_alive()
    annotator.close()
    assert not annotator._loader.is_alive() and annotator.score("a red cup", CUP)[0][">1%"] == 1.0


def test_waiting_for_the_scorer_scores_every_caption():
    annotator = _SlowAnnotator(0.15)
    records, summary, _ = _run(annotator, frames=4)
    assert all(r.coverage == {">1%": 1.0, ">3%": 1.0, ">5%": 1.0, ">10%": 1.0} for r in records)
    assert annotator.loads == ["MainThread"] and "coverage_unscored" not in summary.to_json()


def test_cameras_load_in_the_background_and_files_wait_unless_told():
    live, file = ScriptedSource([], live=True), ScriptedSource([])
    assert coverage_in_background(RunSettings(source="0"), [live]) is True
    assert coverage_in_background(RunSettings(source="x"), [file]) is False
    assert coverage_in_background(RunSettings(source="0", coverage_load="wait"), [live]) is False
    assert coverage_in_background(RunSettings(source="x", coverage_load="background"), [file]) is True
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    got = settings_from_args(parser.parse_args(["b", "--source", "0", "--coverage-load", "background"]))
    assert got.coverage_load == "background"
