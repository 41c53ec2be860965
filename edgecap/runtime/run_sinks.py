"""The record sinks `edgecap run` can write to, as one table (`SINKS`): each row names the
RunSettings field that asks for the sink and the factory that opens it, so adding an output
is one row. The one-source run (`command.execute`) and the several-camera run
(`multicam.execute_cameras`) both open their sinks through `open_sinks`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from .records import Summary
from .sources import Source


@dataclass
class RunContext:
    """What a sink may need of the run besides its settings."""

    summary: Summary                # the run's, written at the end of --append runs
    stop: threading.Event           # set to end the run (a closed window)
    source: Source | None = None    # the one source; None for several cameras (their sinks follow one)


class SinkRow(NamedTuple):
    setting: str        # the RunSettings field that asks for the sink
    # (closing ExitStack, settings, RunContext) -> a record sink, closed by `closing`
    factory: Callable
    # opened before the start-up (onnxruntime sessions, spaCy), so that one that cannot open
    # fails before anything slow; the others open once the source did
    before_start: bool = False


def jsonl_sink(closing, settings, run: RunContext):
    """The --jsonl writer; with --append the run opens with a run_start line and closes with a
    run_end line holding the run's summary. A run that does not end in order (a second Ctrl-C,
    SIGTERM while winding down, a full disk, an error) ends the log, with or without --append,
    with a run_end line marked `cut_short` whose `stopped_by` says why."""
    from .records import RUN_END, JsonlWriter, cut_short, run_start_record

    summary = run.summary
    jsonl = closing.enter_context(contextlib.closing(JsonlWriter(settings.jsonl, settings.append)))
    if settings.append:
        jsonl.write(run_start_record(summary.source, settings.bundle, settings.area))

    def end(exc_type, exc, _tb) -> bool:
        if exc is not None:
            jsonl.end(*cut_short(summary.to_json(), exc))
        elif settings.append:
            jsonl.write({"kind": RUN_END, **summary.to_json()})
        return False  # whatever cut the run short is still raised

    closing.push(end)  # registered after the writer: runs first, so the last line precedes the close
    return lambda record: jsonl.write(record.to_json())


def window_sink(closing, settings, run: RunContext):
    """--show: a window; q or Esc in it stops the run. Fails at once on a headless OpenCV."""
    from .overlay import Window

    window = closing.enter_context(contextlib.closing(Window()))

    def show(record):
        window.write(record)
        if window.closed:
            run.stop.set()
    return show


def mcap_sink(closing, settings, run: RunContext):
    from .mcap_sink import McapCaptionSink

    return closing.enter_context(contextlib.closing(McapCaptionSink(
        settings.out_mcap, source=run.summary.source, bundle=str(settings.bundle or "")))).write


def rerun_sink(closing, settings, run: RunContext):
    from .rerun_sink import RerunSink

    return closing.enter_context(contextlib.closing(RerunSink(settings.rerun, source=run.summary.source))).write


def video_sink(closing, settings, run: RunContext):
    """--save-video: one video frame per caption, played at the rate captions are expected."""
    from .overlay import VideoSink

    fps = min(settings.max_fps or run.source.fps or 10.0, 30.0)
    return closing.enter_context(contextlib.closing(VideoSink(settings.save_video, fps=fps))).write


# In the order each record reaches them (after the console line, before the caller's own sinks).
SINKS = (
    SinkRow("show", window_sink, before_start=True),
    SinkRow("jsonl", jsonl_sink),
    SinkRow("out_mcap", mcap_sink),
    SinkRow("rerun", rerun_sink),
    SinkRow("save_video", video_sink),
)


def open_sinks(closing, settings, run: RunContext, before_start: bool) -> list:
    """Open the sinks `settings` ask for (those of the start-up phase `before_start` names)."""
    return [row.factory(closing, settings, run) for row in SINKS
            if row.before_start == before_start and getattr(settings, row.setting)]
