"""`edgecap run BUNDLE --source A --source B ...`: several cameras captioned by one process.

One bundle (one copy of the model) serves every camera: each round takes the newest frame of
every camera that has one and captions them as one batch (edgecap.runtime.loop.run_cameras).
A bundle exported with `--batch N` for N cameras runs each round as a single static batch;
rounds with fewer fresh frames are padded (padding rows are computed, never reported).

Each record carries `"camera": i` (its --source position) and its camera's own `source`; the
summary holds the total and a `cameras` list with each camera's drops, stalls, latency
percentiles, coverage and why it stopped. A camera that cannot open at start is a
configuration error (one line, exit 1, nothing started); one that fails or stalls later is
logged and reported, and the others go on.
"""

from __future__ import annotations

import contextlib
import sys
import threading

from edgecap.errors import EdgecapError

from .sources import masked, source_identity

# the options that follow one camera (a window, a video, a caption log, a frame-id-keyed file)
SINGLE_SOURCE_ONLY = (("show", "--show"), ("save_video", "--save-video"), ("out_mcap", "--out-mcap"),
                      ("rerun", "--rerun"), ("detections", "--detections"))


def check_sources(sources: list[str], settings) -> None:
    """One line naming the flag that several sources cannot take, or the repeated source."""
    for name, flag in SINGLE_SOURCE_ONLY:
        if getattr(settings, name):
            raise EdgecapError(f"{flag} follows one camera; with {len(sources)} sources give one "
                               "--source per process for it, or leave it out")
    if settings.batch > 1:
        raise EdgecapError(f"--batch {settings.batch} applies to one source; with {len(sources)} "
                           "sources each round batches one frame of every camera (export the bundle "
                           f"with --batch {len(sources)} to run a round as one batch)")
    seen = set()
    for source in sources:
        if source_identity(source) in seen:
            raise EdgecapError(f"--source {masked(source)} is given twice (as {masked(source_identity(source))}); each camera once")
        seen.add(source_identity(source))


def execute_cameras(captioner, settings, sources: list[str], stop: threading.Event, out=None,
                    sinks=()):
    """The several-source `execute`: -> (summary, the failed cameras' errors or None)."""
    from edgecap.io import interrupt_delivered, stop_on_signals, write_json_atomic

    from .camera import FrameGrabber
    from .loop import Camera, LoopOptions, run_cameras
    from .records import Summary, summary_path
    from .run_parts import coverage_in_background, default_pace
    from .run_parts import log as _log
    from .run_sinks import RunContext, open_sinks
    from .scoring import CoverageAnnotator, bundle_vectors
    from .sources import ACVRSource, SynthSource, make_source, masked

    out = out or sys.stdout
    check_sources(sources, settings)
    beam = captioner.check_beam(settings.beam) if settings.beam is not None else captioner.beam
    built = [make_source(s, fps=settings.source_fps, topic=settings.topic, area=settings.area)
             for s in sources]
    from .detector import DetectorHook, coverage_vocabulary, open_detector

    detector = open_detector(settings)  # every camera's frame of a round in one detector batch
    knows_objects = detector is not None or any(isinstance(s, (ACVRSource, SynthSource)) for s in built)
    coverage = CoverageAnnotator(settings.coverage and knows_objects, log=lambda m: print(m, file=out, flush=True),
                                 vocabulary=None if detector is None else coverage_vocabulary(detector),
                                 background=coverage_in_background(settings, built),
                                 vectors=bundle_vectors(captioner.bundle))
    names = [masked(s) for s in sources]  # a URL's password masked
    summary = Summary(", ".join(names), coverage_area=settings.area, cameras=[])
    if len(sources) > captioner.batch_size:
        _log(f"{len(sources)} cameras, bundle batch {captioner.batch_size}: a full round runs "
             f"{-(-len(sources) // captioner.batch_size)} batches (export with --batch {len(sources)} for one)")
    fresh = threading.Event()
    record_sinks = [] if settings.quiet else [lambda r: print(r.human(), file=out, flush=True)]
    options = LoopOptions(max_fps=settings.max_fps, frames=settings.frames,
                          latency_budget_ms=settings.latency_budget)
    cameras: list[Camera] = []
    with contextlib.ExitStack() as closing:
        closing.callback(coverage.close)  # last out: a background scorer load finishes first
        captioner.warm_up()  # before any camera opens: its driver would queue stale frames
        if detector is not None:
            detector.warm_up()
        coverage.warm_up()
        for index, source in enumerate(built):
            source.open()  # SourceOpenError: one line, exit 1; the cameras opened so far are closed
            try:
                grabber = FrameGrabber(source, pace=settings.pace or default_pace(source), log=_log,
                                       on_publish=lambda frame: fresh.set())
            except BaseException:
                source.close()
                raise
            closing.callback(grabber.close)
            camera_summary = Summary(names[index], coverage_area=settings.area, camera=index)
            camera_summary.grabber = grabber.stats
            summary.cameras.append(camera_summary)
            cameras.append(Camera(index, grabber, camera_summary))
            if getattr(source, "note", None):
                _log(f"camera {index}: {source.note}")
        record_sinks += open_sinks(closing, settings, RunContext(summary, stop), before_start=False)
        record_sinks += list(sinks)
        with stop_on_signals(stop):
            for camera in cameras:
                camera.grabber.start()
            try:
                run_cameras(captioner, cameras, summary, record_sinks, options, stop, fresh,
                            annotate_objects=None if detector is None else DetectorHook(detector),
                            coverage=coverage, beam=beam, log=_log)
            except KeyboardInterrupt:  # a second signal: stop now, still summarise
                interrupt_delivered()
                summary.stopped_by = "signal"
        summary.coverage_unscored = coverage.unscored
        if detector is not None:
            summary.detector = detector.report()
    print(summary.human(), file=out, flush=True)
    if settings.jsonl:
        write_json_atomic(summary_path(settings.jsonl), summary.to_json())
    failed = [f"camera {c.name} ({c.summary.source}): {c.grabber.error}" for c in cameras
              if c.grabber.error is not None]
    return summary, ("; ".join(failed) or None)
