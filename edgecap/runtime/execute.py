"""What `edgecap run` does once its settings are read: check them, open the sources, run the
one captioning loop (loop.py) into the sinks (run_sinks.py), summarise.

One source or several, the same path: each source becomes a `Camera` (a capture thread and a
summary) and the loop takes the newest frame of each per round; with one source the camera's
summary is the run's and the records carry no "camera" field. One bundle (one copy of the
model) serves every camera: a bundle exported with `--batch N` for N cameras runs each round as
a single static batch; rounds with fewer fresh frames are padded (never reported).

`plan_run(settings)` checks everything that needs no bundle (values, outputs, sources,
--detections, and opens the --detector, whose checks need its session) so that the CLI fails
before the slow bundle load; `execute` runs the plan.

The caption log (--jsonl) closes last, after the summary file is written: a second Ctrl-C at
any point of the wind-down leaves either a log and a summary file that say how the run ended, or
a log whose last line is a run_end marked cut_short (run_sinks.jsonl_sink). The first signal
only asks the loop to stop, through the whole wind-down.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from edgecap.argtypes import BATCH, BEAM, COUNT, FRACTION, POSITIVE, THREADS
from edgecap.data.coco_categories import load_categories
from edgecap.errors import EdgecapError
from edgecap.io import interrupt_delivered, stop_on_signals, write_json_atomic
from edgecap.metrics.vocabulary import vocabulary_of

from .camera import FrameGrabber, default_pace
from .coco_results import DEFAULT_MIN_SCORE
from .detections import Detections, few_ids
from .detector import Detector, DetectorHook, open_detector
from .loop import Camera, LoopOptions, run_cameras
from .records import Summary, check_jsonl_target, summary_path
from .run_sinks import RunContext, open_sinks
from .scoring import CoverageAnnotator, bundle_vectors
from .sources import ACVRSource, FolderSource, SynthSource, make_source, masked, source_identity

# the options that follow one camera (a window, a video, a caption log, a frame-id-keyed file)
SINGLE_SOURCE_ONLY = (("show", "--show"), ("save_video", "--save-video"), ("out_mcap", "--out-mcap"),
                      ("rerun", "--rerun"), ("detections", "--detections"))


def log(msg: str) -> None:
    print(f"edgecap run: {msg}", file=sys.stderr, flush=True)


def source_list(source: str | list[str]) -> list[str]:
    """RunSettings.source as a list (one or several cameras)."""
    return list(source) if isinstance(source, (list, tuple)) else [source]


@dataclass
class RunPlan:
    """A run's checked settings and what they name, before the bundle loads."""

    settings: object                    # command.RunSettings
    sources: list                       # sources.Source, not opened yet
    names: list[str]                    # as the records and summary show them (passwords masked)
    detections: Detections | None
    detector: Detector | None           # --detector, opened (its checks need the session)


def plan_run(settings) -> RunPlan:
    """Every check that needs no bundle, in the order a user would fix them: one line each."""
    check_settings(settings)
    specs = source_list(settings.source)
    if len(specs) > 1:
        check_sources(specs, settings)
    detections = _detections(settings)
    sources = [make_source(s, fps=settings.source_fps, topic=settings.topic, area=settings.area) for s in specs]
    if detections is not None and isinstance(sources[0], FolderSource):
        detections.check_folder(sources[0].paths, sources[0].name)
    if settings.out_mcap:
        _check_out_mcap(settings.out_mcap, sources[0])
    if settings.rerun:
        from .rerun_sink import check_target

        check_target(settings.rerun)
    return RunPlan(settings, sources, [masked(s) for s in specs], detections, open_detector(settings))


def execute(captioner, settings, stop: threading.Event | None = None, out=None, sinks=(),
            plan: RunPlan | None = None):
    """Run the loop with `settings`; returns (summary, the failed sources' errors or None).
    `sinks` get every record too, after the console and the outputs `settings` ask for
    (run_sinks.SINKS). `plan`: plan_run(settings), when the caller checked them already."""
    plan = plan or plan_run(settings)
    out, stop = out or sys.stdout, stop or threading.Event()
    several = len(plan.sources) > 1
    options = _loop_options(captioner, settings, several)
    summary = Summary(", ".join(plan.names), coverage_area=settings.area, cameras=[] if several else None)
    coverage = _coverage(captioner, settings, plan, lambda m: print(m, file=out, flush=True))
    annotate_objects = _annotator(plan)
    record_sinks = [] if settings.quiet else [lambda r: print(r.human(), file=out, flush=True)]
    cameras: list[Camera] = []
    with contextlib.ExitStack() as last:  # the caption log: closed after the summary file is written
        run = RunContext(summary, stop, None if several else plan.sources[0], last=last)
        with contextlib.ExitStack() as closing:
            closing.callback(coverage.close)  # last out: a background scorer load finishes first
            record_sinks += open_sinks(closing, settings, run, before_start=True)
            # Start-up costs (onnxruntime sessions, spaCy) are paid before any source opens: a
            # camera opened early would queue frames in its driver, and they would come out stale.
            _warm_up(captioner, plan.detector, coverage)
            fresh = threading.Event()
            cameras = _open_cameras(closing, plan, summary, fresh)
            if plan.detections is not None and plan.detections.note:
                log(f"--detections {settings.detections}: {plan.detections.note}")
            record_sinks += open_sinks(closing, settings, run, before_start=False) + list(sinks)
            last.enter_context(stop_on_signals(stop))  # through the wind-down, up to the log's close
            for camera in cameras:
                camera.grabber.start()
            try:
                run_cameras(captioner, cameras, summary, record_sinks, options, stop, fresh,
                            annotate_objects=annotate_objects, coverage=coverage,
                            stall_s=2.0 if several else None, log=log if several else None)
            except KeyboardInterrupt:  # a second signal: stop now, still summarise
                interrupt_delivered()
                summary.stopped_by = "signal"
            _reports(summary, plan, coverage)  # before the --append run_end line is written
        _finish(summary, plan, out)
    return summary, _failures(cameras)


def _warm_up(captioner, detector: Detector | None, coverage: CoverageAnnotator) -> None:
    captioner.warm_up()
    if detector is not None:
        detector.warm_up()
    coverage.warm_up()


def _reports(summary: Summary, plan: RunPlan, coverage: CoverageAnnotator) -> None:
    """What the summary says of the object sources and the scorer, once the loop is done."""
    if plan.detections is not None:
        summary.detections = plan.detections.report()
    if plan.detector is not None:
        summary.detector = plan.detector.report()
    summary.coverage_unscored = coverage.unscored


def _finish(summary: Summary, plan: RunPlan, out) -> None:
    """The summary on the console, the --detections notes, the --jsonl summary file."""
    settings = plan.settings
    print(summary.human(), file=out, flush=True)
    if plan.detections is not None:
        _report_unmatched(plan.detections, settings.detections)
    if settings.jsonl:
        write_json_atomic(summary_path(settings.jsonl), summary.to_json())


def _loop_options(captioner, settings, several: bool) -> LoopOptions:
    """The loop's options, checked against the bundle's static batch and beams."""
    if not several and settings.batch > captioner.batch_size:
        raise EdgecapError(f"--batch {settings.batch} exceeds the bundle's static batch "
                           f"{captioner.batch_size} (export with --batch {settings.batch})")
    if several and len(source_list(settings.source)) > captioner.batch_size:
        n = len(source_list(settings.source))
        log(f"{n} cameras, bundle batch {captioner.batch_size}: a full round runs "
            f"{-(-n // captioner.batch_size)} batches (export with --batch {n} for one)")
    beam = captioner.check_beam(settings.beam) if settings.beam is not None else captioner.beam
    return LoopOptions(batch=settings.batch, max_fps=settings.max_fps, frames=settings.frames,
                       latency_budget_ms=settings.latency_budget, beam=beam)


def _open_cameras(closing, plan: RunPlan, summary: Summary, fresh: threading.Event) -> list[Camera]:
    """Open every source and its capture thread (not started), each closed by `closing`. A
    source that cannot open raises SourceOpenError (one line, exit 1); those opened so far close."""
    several = len(plan.sources) > 1
    cameras = []
    for index, source in enumerate(plan.sources):
        pace = plan.settings.pace or default_pace(source)
        source.open()
        try:
            grabber = FrameGrabber(source, pace=pace, log=log, on_publish=lambda frame: fresh.set())
        except BaseException:
            source.close()
            raise
        closing.callback(grabber.close)  # joins the thread, then releases the device
        own = Summary(plan.names[index], coverage_area=plan.settings.area, camera=index) if several else summary
        own.grabber = grabber.stats
        if several:
            summary.cameras.append(own)
        cameras.append(Camera(index if several else None, grabber, own))
        if getattr(source, "note", None):
            log(f"camera {index}: {source.note}" if several else source.note)
    return cameras


def _failures(cameras: list[Camera]) -> str | None:
    """The failed sources' errors, one line ("camera i (source): error; ..." with several)."""
    failed = [c for c in cameras if c.grabber.error is not None]
    if len(cameras) == 1:
        return str(failed[0].grabber.error) if failed else None
    return "; ".join(f"camera {c.label}: {c.grabber.error}" for c in failed) or None


def check_settings(settings) -> None:
    """The flags' own types, again for the values a --config file gave, and the outputs, checked
    before anything loads rather than found unwritable at the first caption."""
    for name, value, kind in (("--beam", settings.beam, BEAM), ("--batch", settings.batch, BATCH),
                              ("--frames", settings.frames, COUNT), ("--threads", settings.threads, THREADS),
                              ("--max-fps", settings.max_fps, POSITIVE),
                              ("--latency-budget", settings.latency_budget, POSITIVE),
                              ("--source-fps", settings.source_fps, POSITIVE),
                              ("--min-score", settings.min_score, FRACTION),
                              ("--nms-iou", settings.nms_iou, FRACTION)):
        if value is not None:
            kind.check(value, name)
    _check_outputs_are_not_inputs(settings)
    if settings.jsonl:
        check_jsonl_target(settings.jsonl, settings.append)
    if settings.save_video:
        from .overlay import check_video_path

        check_video_path(settings.save_video)


def check_sources(sources: list[str], settings) -> None:
    """Several sources: one line naming the flag that they cannot take, or the repeated source."""
    for name, flag in SINGLE_SOURCE_ONLY:
        if getattr(settings, name):
            raise EdgecapError(f"{flag} follows one camera; with {len(sources)} sources give one "
                               "--source per process for it, or leave it out")
    if settings.batch > 1:
        raise EdgecapError(f"--batch {settings.batch} applies to one source; with {len(sources)} "
                           "sources each round batches one frame of every camera (export the bundle "
                           f"with --batch {len(sources)} to run a round as one batch)")
    seen = set()
    for source in sources:  # one camera under two spellings (a trailing slash, a symlink, 0 and 00)
        identity = source_identity(source)
        if identity in seen:
            raise EdgecapError(f"--source {masked(source)} is given twice (as {masked(identity)}); each camera once")
        seen.add(identity)


def _check_outputs_are_not_inputs(settings) -> None:
    """`--jsonl video.jsonl` where video.jsonl is the --detections file, `--save-video clip.mp4`
    where clip.mp4 is the --source: one line, before anything is overwritten. (--out-mcap and
    --rerun replace only files that carry edgecap's own metadata.)"""
    outputs = {"--jsonl": settings.jsonl, "--save-video": settings.save_video}
    if settings.jsonl:
        outputs["the --jsonl summary"] = summary_path(settings.jsonl)
    inputs = [("--source", s) for s in source_list(settings.source)] + [("--detections", settings.detections),
                                                                          ("--detector", settings.detector)]
    seen: list[tuple[str, str]] = [(flag, os.path.expanduser(p)) for flag, p in inputs
                                   if p and os.path.isfile(os.path.expanduser(p))]
    for flag, path in ((f, os.path.expanduser(p)) for f, p in outputs.items() if p):
        for other, other_path in seen:
            if os.path.abspath(path) == os.path.abspath(other_path) or (
                    os.path.exists(path) and os.path.exists(other_path) and os.path.samefile(path, other_path)):
                raise EdgecapError(f"{flag} {path} is also {other}; write each output to its own file")
        seen.append((flag, path))


def coverage_in_background(settings, sources) -> bool:
    """--coverage-load: as asked, else in the background when every source is live (a camera
    or stream, whose first caption a restarted robot waits for)."""
    if settings.coverage_load is not None:
        return settings.coverage_load == "background"
    return all(source.live for source in sources)


def _coverage(captioner, settings, plan: RunPlan, say) -> CoverageAnnotator:
    """Coverage is scored when some source knows its objects (ACVR, synth) or --detections or a
    --detector gives them; with the word vectors the bundle carries (bundle_vectors)."""
    knows_objects = plan.detections is not None or plan.detector is not None or any(
        isinstance(s, (ACVRSource, SynthSource)) for s in plan.sources)
    return CoverageAnnotator(settings.coverage and knows_objects, log=say,
                             vocabulary=coverage_vocabulary(plan.detections, plan.detector),
                             vectors=bundle_vectors(captioner.bundle),
                             background=coverage_in_background(settings, plan.sources))


def _annotator(plan: RunPlan):
    """The loop's object hook, replacing the sources' own objects: --detections (each frame's
    objects, None where the file says nothing of it) or --detector (every frame of a round in
    one batch, its time as the records' "detector" latency). The plug point of every external
    object source: frames -> one list per frame."""
    if plan.detector is not None:
        return DetectorHook(plan.detector)
    detections = plan.detections
    if detections is None:
        return None
    by_name = isinstance(plan.sources[0], FolderSource)  # COCO image_ids name folder images by stem

    def annotate_objects(frames):
        return [detections.objects(frame.frame_id, frame.image.shape[1], frame.image.shape[0],
                                   frame.image_id if by_name else None) for frame in frames]
    return annotate_objects


def _detections(settings) -> Detections | None:
    coco_flags = (("--categories", settings.categories), ("--category-base", settings.category_base),
                  ("--min-score", settings.min_score))
    if not settings.detections:
        for flag, value in coco_flags if not settings.detector else ():  # a --detector's: open_detector
            if value is not None:
                raise EdgecapError(f"{flag} applies to a --detections file or a --detector; neither was given")
        return None
    min_score = DEFAULT_MIN_SCORE if settings.min_score is None else settings.min_score
    categories = None
    if settings.categories:
        categories = load_categories(settings.categories)
    detections = Detections(settings.detections, settings.area, min_score=min_score, categories=categories,
                            category_base=settings.category_base or "auto")
    given = [flag for flag, value in coco_flags if value is not None]
    if given and not detections.coco:
        raise EdgecapError(f"{given[0]} applies to COCO detection results; --detections {settings.detections} "
                           "is edgecap's JSON Lines, whose objects carry their class names")
    return detections


def coverage_vocabulary(detections, detector: Detector | None = None):
    """The class set coverage reads captions against: a detector's classes, a COCO results file's
    categories (COCO's 80 or --categories FILE), else ACVR's 30 (ACVR, the synthetic world,
    edgecap's JSONL; their objects' own class names join it as they come)."""
    if detector is not None:
        from .detector import coverage_vocabulary as detector_vocabulary

        return detector_vocabulary(detector)
    if detections is None or detections.categories is None:
        return None

    categories = detections.categories
    return vocabulary_of(categories.names.values(), categories.origin)


def _report_unmatched(detections, path: str) -> None:
    """Detections of images the run never captioned: a misnamed folder or a results file for
    another split shows up here (and in summary.json) instead of as silently missing coverage;
    so do boxes that lay wholly outside their frames (left out, counted)."""
    if detections.outside_note():
        log(detections.outside_note())
    unmatched = detections.unmatched()
    if unmatched:
        log(f"--detections {path}: {len(unmatched)} of {len(detections)} {detections.id_name} matched no "
            f"captioned frame ({few_ids(unmatched, 5)})")


def _check_out_mcap(path: str, source) -> None:
    """Fail before any slow start-up: an unwritable target, a file edgecap did not write, or
    the input log itself."""
    from edgecap.ros.mcap_out import check_target

    target = Path(path).expanduser().resolve()
    log_path = getattr(source, "path", None)
    if log_path is not None and (target == Path(log_path).resolve()
                                 or Path(log_path).resolve() in target.parents):
        raise EdgecapError(f"--out-mcap {path} is the input log; write the captions to their "
                           "own file")
    check_target(path)
