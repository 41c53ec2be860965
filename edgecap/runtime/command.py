"""`edgecap run BUNDLE --source SRC`: caption a camera, stream, video, folder or the synthetic
world with an exported bundle; torch-free.

    edgecap run bundle/ --source 0 --beam 3 --jsonl captions.jsonl
    edgecap run bundle/ --source data/acvr/000000 --jsonl acvr.jsonl       # with coverage
    edgecap run bundle/ --source synth://tabletop --frames 100 --save-video out.mp4
    edgecap run bundle/ --source video.mp4 --detections video.jsonl --latency-budget 80
    edgecap run bundle/ --source run.mcap --topic /camera/image_raw --out-mcap captions.mcap

Ctrl-C or SIGTERM stops between batches: the summary is printed and the JSONL is complete.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from dataclasses import dataclass

from edgecap.argtypes import BATCH, BEAM, COUNT, FRACTION, POSITIVE, THREADS
from edgecap.contract.objects import AREAS
from edgecap.data.coco_categories import CATEGORY_BASES

from .coco_results import DEFAULT_MIN_SCORE
from .detector import DEFAULT_IOU, open_detector
from .detector import DEFAULT_MIN_SCORE as DETECTOR_MIN_SCORE
from .records import summary_path
from .run_parts import coverage_in_background, default_pace
from .run_parts import log as _log


@dataclass
class RunSettings:
    source: str | list[str]                       # several: one process captions every camera
    bundle: str | None = None
    beam: int | None = None
    max_fps: float | None = None
    batch: int = 1
    frames: int | None = None
    jsonl: str | None = None
    append: bool = False
    detections: str | None = None
    detector: str | None = None                   # an ONNX object detector run beside the captioner
    nms_iou: float | None = None
    categories: str | None = None
    category_base: str | None = None
    min_score: float | None = None
    show: bool = False
    save_video: str | None = None
    latency_budget: float | None = None
    coverage: bool = True
    coverage_load: str | None = None              # "wait" or "background"; None: background for live sources
    pace: str | None = None
    source_fps: float | None = None
    providers: list[str] | None = None
    engine: str = "auto"                          # the bundle's TensorRT engines or its ONNX graphs
    threads: int = 0
    spin: bool = True
    quiet: bool = False
    topic: str | None = None
    replay: str | None = None
    out_mcap: str | None = None
    rerun: str | None = None
    area: str = "box"


# Config-file keys: RunSettings fields; these are paths, resolved against the config's folder
# (a deployed config travels with its bundle; docs/runtime.md says why training configs differ).
CONFIG_PATHS = ("bundle", "jsonl", "detections", "detector", "categories", "save_video", "out_mcap", "rerun")
# ... and so is `source` (each of them) when it names a file or folder (not a camera index or a URL)
CONFIG_INPUTS = ("bundle", "detections", "detector", "categories")
REPLAY_PACE = {"realtime": "native", "fast": "every"}
COVERAGE_LOADS = ("wait", "background")


def add_arguments(parser) -> None:
    # Every default is None so that a --config file can supply it and a flag still overrides.
    parser.add_argument("bundle", nargs="?", default=None,
                        help="an exported bundle directory (edgecap export)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="TOML file of these options (keys as the flags: source, beam, "
                             "max_fps, ...); flags given on the command line win. Relative paths in "
                             "it (bundle, source, jsonl, ...) are relative to the config file's "
                             "folder, not to where edgecap runs (unlike a training config: "
                             "docs/runtime.md)")
    parser.add_argument("--source", action="append", default=None,
                        help="camera index (0), video file, rtsp:// or http:// URL, image folder, "
                             "ACVR sequence folder, or synth://tabletop[?seed=S&size=N&fps=F]; give "
                             "--source several times to caption several cameras in one process, one "
                             "frame of each per batch (export with --batch = the number of cameras)")
    parser.add_argument("--beam", type=BEAM, default=None,
                        help="beam size, 1..the bundle's (default: the bundle's)")
    parser.add_argument("--max-fps", type=POSITIVE, default=None, metavar="F",
                        help="caption at most F frames per second (frames in between are dropped)")
    parser.add_argument("--batch", type=BATCH, default=None, metavar="N",
                        help="caption N consecutive fresh frames together (<= the bundle's batch; "
                             "default 1)")
    parser.add_argument("--frames", type=COUNT, default=None, metavar="N",
                        help="stop after N captions")
    parser.add_argument("--jsonl", default=None, metavar="FILE",
                        help="write one JSON record per caption (and the summary at exit: r.jsonl -> r.summary.json)")
    parser.add_argument("--append", action="store_true", default=None,
                        help="add to an existing --jsonl FILE instead of replacing it; each run "
                             "opens with a {\"kind\": \"run_start\"} line and ends with a "
                             "\"run_end\" line holding its summary")
    parser.add_argument("--detections", default=None, metavar="FILE",
                        help="objects per frame from an external detector: JSONL (frame_id, objects) "
                             "or a COCO detection results JSON (detectron2, mmdetection, ultralytics; "
                             "image_id = a folder image's file stem, else the frame index)")
    parser.add_argument("--detector", default=None, metavar="MODEL.onnx",
                        help="run an ONNX object detector on the captioned frames (ultralytics YOLO "
                             "export, YOLOv5, end-to-end; every camera's frame in one batch); its "
                             "objects feed coverage and the annotations as --detections does")
    parser.add_argument("--nms-iou", type=FRACTION, default=None, metavar="F",
                        help=f"--detector: boxes of one class overlapping by more than F are one object "
                             f"(default {DEFAULT_IOU})")
    parser.add_argument("--categories", default=None, metavar="FILE",
                        help="COCO results or --detector: category names from a COCO-format annotation "
                             "file's \"categories\" or a YOLO data.yaml's names (default: COCO's 80; "
                             "a detector's own metadata)")
    parser.add_argument("--category-base", choices=CATEGORY_BASES, default=None,
                        help="COCO results: 'auto' (default) reads category_id as the dataset's own id "
                             "(COCO's 1..90, an annotation file's) and a data.yaml's classes from 1 "
                             "unless an id 0 is in the file; 0 or 1: category_id is a class index "
                             "counted from 0 (older ultralytics) or 1 (ultralytics 8.3+)")
    parser.add_argument("--min-score", type=FRACTION, default=None, metavar="S",
                        help=f"COCO results: keep detections scoring at least S (default "
                             f"{DEFAULT_MIN_SCORE}, detectron2's demo threshold); --detector: default "
                             f"{DETECTOR_MIN_SCORE}")
    parser.add_argument("--show", action="store_true", default=None,
                        help="show annotated frames in a window (q or Esc stops)")
    parser.add_argument("--save-video", default=None, metavar="FILE",
                        help="write annotated frames (caption, object boxes) to an mp4")
    parser.add_argument("--latency-budget", type=POSITIVE, default=None, metavar="MS",
                        help="lower the beam while capture-to-caption latency exceeds MS")
    parser.add_argument("--coverage", action=argparse.BooleanOptionalAction, default=None,
                        help="score object coverage when objects are known (default on)")
    parser.add_argument("--coverage-load", choices=COVERAGE_LOADS, default=None,
                        help="'wait': load the coverage scorer (spaCy, GloVe: seconds) before the first "
                             "caption, so every caption is scored; 'background': caption at once and load it "
                             "after the first caption, leaving the captions before it unscored (default: "
                             "background for cameras and streams, wait for files, folders, synth and logs)")
    parser.add_argument("--area", choices=AREAS, default=None,
                        help="an object's coverage area: its bounding box (default, as edgecap eval "
                             "coverage and SMArT) or its mask pixels (ACVR num_pixels / mask, the "
                             "world's pixel count, a detection's 'area')")
    parser.add_argument("--pace", choices=("native", "every"), default=None,
                        help="files, folders, synth: 'native' plays at the source's fps and keeps "
                             "only the newest frame; 'every' captions every frame as fast as it can "
                             "(default: native for video and synth, every for folders and ACVR)")
    parser.add_argument("--topic", default=None,
                        help="robot logs: the image topic (sensor_msgs/Image or CompressedImage); "
                             "needed when the log has several")
    parser.add_argument("--replay", choices=tuple(REPLAY_PACE), default=None,
                        help="robot logs and other files: 'realtime' plays at the recorded rate "
                             "(= --pace native), 'fast' captions every image as fast as it can "
                             "(= --pace every); default realtime")
    parser.add_argument("--out-mcap", default=None, metavar="FILE",
                        help="write the captions as an MCAP log (std_msgs/String caption and "
                             "JSON record, foxglove_msgs/ImageAnnotations) stamped like the images")
    parser.add_argument("--rerun", default=None, metavar="FILE.rrd",
                        help="write the frames, boxes, captions and latencies as a rerun "
                             "recording (pip install \"edgecap[rerun]\")")
    parser.add_argument("--source-fps", type=POSITIVE, default=None, metavar="F",
                        help="frame rate for --pace native (default: the video's own / synth fps)")
    parser.add_argument("--providers", default=None,
                        help="onnxruntime execution providers, comma-separated "
                             "(default: the best installed, e.g. TensorRT, CUDA, CPU)")
    parser.add_argument("--engine", choices=("auto", "onnxruntime", "tensorrt"), default=None,
                        help="run the bundle's TensorRT engines or its ONNX graphs (default auto: the "
                             "engines when the bundle has them and their TensorRT imports)")
    parser.add_argument("--threads", type=THREADS, default=None, metavar="N",
                        help="onnxruntime intra-op threads (default 0: onnxruntime decides)")
    parser.add_argument("--spin", action=argparse.BooleanOptionalAction, default=None,
                        help="let idle onnxruntime threads busy-wait between the ops of a run "
                             "(default on; --no-spin lets them sleep, for robots whose other "
                             "processes need the cores mid-caption)")
    parser.add_argument("--quiet", action="store_true", default=None,
                        help="no line per caption, summary only")


def _toml_types(annotation: str):
    """The TOML value types a RunSettings field takes, from its annotation ("float | None": an
    integer or a float; a missing value is a missing key, never None)."""
    return {"bool": bool, "int": int, "float": (int, float), "list[str]": list,
            "str | list[str]": (str, list)}.get(annotation.removesuffix(" | None"), str)


_TOML_KIND = {bool: "true or false", int: "an integer", (int, float): "a number",
              list: 'a list of strings, e.g. ["CPUExecutionProvider"]',
              (str, list): 'a string in quotes or a list of them, e.g. ["0", "rtsp://rear/stream"]'}


def read_config(path: str) -> dict:
    """A runtime TOML config as RunSettings keyword arguments (robot/edgecap-runtime.toml)."""
    from dataclasses import fields
    from pathlib import Path

    from edgecap.errors import EdgecapError, did_you_mean
    from edgecap.jsonio import read_toml

    path = Path(path)
    data = read_toml(path, where=f"--config {path}")
    known = {f.name: f for f in fields(RunSettings)}
    out = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise EdgecapError(f"--config {path}: unknown key {key!r}{did_you_mean(name, known)}; "
                               f"keys: {', '.join(known)}")
        if name == "providers" and isinstance(value, str):
            value = [p.strip() for p in value.split(",") if p.strip()]
        expected = _toml_types(known[name].type)
        if isinstance(value, bool) and expected is not bool or not isinstance(value, expected):
            raise EdgecapError(f"--config {path}: {key} = {value!r} has the wrong type: expected "
                               f"{_TOML_KIND.get(expected, 'a string in quotes')}")
        if name == "source":
            written = value if isinstance(value, list) else [value]
            if not written or not all(isinstance(v, str) for v in written):
                raise EdgecapError(f"--config {path}: {key} = {value!r}: expected "
                                   f"{_TOML_KIND[(str, list)]}")
            value = [_config_source(path, v) for v in written]
            value = value[0] if len(value) == 1 else value
        elif name in CONFIG_PATHS:
            value = str((path.parent / Path(value).expanduser()).resolve())
        if name in CONFIG_INPUTS and _names_a_path(data[key]):
            _check_config_relative(path, key, data[key], value)
        out[name] = value
    return out


def _config_source(config, written: str) -> str:
    """A config's source: a relative file or folder is relative to the config's folder."""
    from pathlib import Path

    value = written
    if _names_a_path(written) and not Path(written).expanduser().is_absolute():
        # joined, not resolved: a camera's /dev/v4l/by-id link must stay the name reopened
        value = os.path.abspath(config.parent / Path(written).expanduser())
    if _names_a_path(written):
        _check_config_relative(config, "source", written, value)
    return value


def source_list(source: str | list[str]) -> list[str]:
    """RunSettings.source as a list (one or several cameras)."""
    return list(source) if isinstance(source, (list, tuple)) else [source]


def _names_a_path(source: str) -> bool:
    """A source string that is a file or folder, not a camera index or a URL (synth://, rtsp://)."""
    text = source.strip()
    return bool(text) and not text.isdigit() and "://" not in text


def _check_config_relative(config, key: str, written: str, resolved: str) -> None:
    """A relative input path of a config that is missing beside the config but present from the
    current directory was written for the other rule: say so in one line instead of failing
    later on a path the user never typed (or, worse, taking the other file)."""
    from pathlib import Path

    from edgecap.errors import EdgecapError

    here = Path(written).expanduser()
    if here.is_absolute() or Path(resolved).exists() or not here.exists():
        return
    raise EdgecapError(f"--config {config}: {key} = {written!r} is relative to the config's folder, and "
                       f"{resolved} does not exist ({here.resolve()} does: write that path in the config)")


def settings_from_args(args) -> RunSettings:
    """Defaults < --config file < flags given on the command line."""
    from dataclasses import fields

    from edgecap.errors import EdgecapError

    merged = read_config(args.config) if args.config else {}
    for name in (f.name for f in fields(RunSettings) if f.name != "providers"):  # every flag's dest
        value = getattr(args, name)
        if value is not None:
            merged[name] = value
    if args.providers:
        merged["providers"] = [p.strip() for p in args.providers.split(",") if p.strip()]
    if isinstance(merged.get("source"), list) and len(merged["source"]) == 1:
        merged["source"] = merged["source"][0]  # one camera: the single-source run, unchanged
    for needed, how in (("bundle", "BUNDLE"), ("source", "--source SRC")):
        if not merged.get(needed):
            raise EdgecapError(f"no {needed} given: pass {how} or put {needed} = ... in --config")
    if merged.get("append") and not merged.get("jsonl"):
        raise EdgecapError("--append adds to the --jsonl file: pass --jsonl FILE too")
    if merged.get("pace") not in (None, "native", "every"):
        raise EdgecapError(f"pace = {merged['pace']!r}; expected native or every")
    if merged.get("coverage_load") not in (None, *COVERAGE_LOADS):
        raise EdgecapError(f"coverage_load = {merged['coverage_load']!r}; expected wait or background")
    if merged.get("area") not in (None, *AREAS):
        raise EdgecapError(f"area = {merged['area']!r}; expected {' or '.join(AREAS)}")
    if merged.get("category_base") not in (None, *CATEGORY_BASES):
        raise EdgecapError(f"category_base = {merged['category_base']!r}; expected \"auto\", \"0\" or \"1\" "
                           "(in quotes)")
    replay = merged.get("replay")
    if replay is not None:
        if replay not in REPLAY_PACE:
            raise EdgecapError(f"replay = {replay!r}; expected {' or '.join(REPLAY_PACE)}")
        if merged.get("pace") not in (None, REPLAY_PACE[replay]):
            raise EdgecapError(f"--replay {replay} and --pace {merged['pace']} disagree; "
                               "give one of them")
        merged["pace"] = REPLAY_PACE[replay]
    return RunSettings(**merged)


def _check(settings: RunSettings) -> None:

    # the flags' own types, again for the values a --config file gave
    for name, value, kind in (("--beam", settings.beam, BEAM), ("--batch", settings.batch, BATCH),
                              ("--frames", settings.frames, COUNT), ("--threads", settings.threads, THREADS),
                              ("--max-fps", settings.max_fps, POSITIVE), ("--latency-budget", settings.latency_budget, POSITIVE),
                              ("--source-fps", settings.source_fps, POSITIVE),
                              ("--min-score", settings.min_score, FRACTION), ("--nms-iou", settings.nms_iou, FRACTION)):
        if value is not None:
            kind.check(value, name)
    # outputs are checked before the bundle loads, not found unwritable at the first caption
    _check_outputs_are_not_inputs(settings)
    if settings.jsonl:
        from .records import check_jsonl_target

        check_jsonl_target(settings.jsonl, settings.append)
    if settings.save_video:
        from .overlay import check_video_path

        check_video_path(settings.save_video)


def _check_outputs_are_not_inputs(settings: RunSettings) -> None:
    """`--jsonl video.jsonl` where video.jsonl is the --detections file, `--save-video clip.mp4`
    where clip.mp4 is the --source: one line, before anything is overwritten. (--out-mcap and
    --rerun replace only files that carry edgecap's own metadata.)"""
    import os

    from edgecap.errors import EdgecapError

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


def execute(captioner, settings: RunSettings, stop: threading.Event | None = None, out=None,
            sinks=()):
    """Run the loop with `settings`; returns (summary, error message or None). `sinks` get every
    record too, after the console and the outputs `settings` ask for (run_sinks.SINKS)."""
    import contextlib

    from edgecap.errors import EdgecapError
    from edgecap.io import interrupt_delivered, stop_on_signals, write_json_atomic

    from .camera import FrameGrabber
    from .loop import LoopOptions, run_loop
    from .records import Summary
    from .run_sinks import RunContext, open_sinks
    from .scoring import CoverageAnnotator, bundle_vectors
    from .sources import ACVRSource, FolderSource, SynthSource, make_source, masked

    out = out or sys.stdout
    stop = stop or threading.Event()
    _check(settings)
    if len(source_list(settings.source)) > 1:
        from .multicam import execute_cameras

        return execute_cameras(captioner, settings, source_list(settings.source), stop, out, sinks)
    if settings.batch > captioner.batch_size:
        raise EdgecapError(f"--batch {settings.batch} exceeds the bundle's static batch "
                           f"{captioner.batch_size} (export with --batch {settings.batch})")
    beam = captioner.check_beam(settings.beam) if settings.beam is not None else captioner.beam
    detections = _detections(settings)
    detector = open_detector(settings)
    source = make_source(settings.source, fps=settings.source_fps, topic=settings.topic, area=settings.area)
    if detections is not None and isinstance(source, FolderSource):
        detections.check_folder(source.paths, source.name)
    if settings.out_mcap:
        _check_out_mcap(settings.out_mcap, source)
    if settings.rerun:
        from .rerun_sink import check_target

        check_target(settings.rerun)
    knows_objects = detections is not None or detector is not None or isinstance(source, (ACVRSource, SynthSource))
    coverage = CoverageAnnotator(settings.coverage and knows_objects,
                                 log=lambda m: print(m, file=out, flush=True),
                                 vocabulary=_coverage_vocabulary(detections, detector),
                                 vectors=bundle_vectors(captioner.bundle),
                                 background=coverage_in_background(settings, [source]))
    summary = Summary(masked(settings.source), coverage_area=settings.area)  # a URL's password masked
    extra_sinks, sinks = list(sinks), []
    if not settings.quiet:
        sinks.append(lambda r: print(r.human(), file=out, flush=True))
    annotate_objects = None
    if detections is not None:
        by_name = isinstance(source, FolderSource)  # COCO image_ids name folder images by stem

        def annotate_objects(frames):
            return [detections.objects(frame.frame_id, frame.image.shape[1], frame.image.shape[0],
                                       frame.image_id if by_name else None) for frame in frames]
    elif detector is not None:
        from .detector import DetectorHook

        annotate_objects = DetectorHook(detector)

    options = LoopOptions(batch=settings.batch, max_fps=settings.max_fps,
                          frames=settings.frames, latency_budget_ms=settings.latency_budget)
    run = RunContext(summary, stop, source)
    with contextlib.ExitStack() as closing:
        closing.callback(coverage.close)  # last out: a background scorer load finishes first
        sinks += open_sinks(closing, settings, run, before_start=True)
        # Start-up costs (onnxruntime sessions, spaCy) are paid before the source opens: a
        # camera opened early would queue frames in its driver, and they would come out stale.
        captioner.warm_up()
        if detector is not None:
            detector.warm_up()
        coverage.warm_up()
        source.open()  # a source that cannot open raises SourceOpenError: one line, exit 1
        try:
            grabber = FrameGrabber(source, pace=settings.pace or default_pace(source), log=_log)
        except BaseException:
            source.close()
            raise
        summary.grabber = grabber.stats
        closing.callback(grabber.close)  # joins the thread, then releases the device
        if getattr(source, "note", None):
            _log(source.note)
        if detections is not None and detections.note:
            _log(f"--detections {settings.detections}: {detections.note}")
        sinks += open_sinks(closing, settings, run, before_start=False) + extra_sinks
        with stop_on_signals(stop):
            grabber.start()
            try:
                run_loop(captioner, grabber, summary, sinks, options, stop,
                         annotate_objects=annotate_objects, coverage=coverage, beam=beam)
            except KeyboardInterrupt:  # a second signal: stop now, still summarise
                interrupt_delivered()
                summary.stopped_by = "signal"
        if detections is not None:  # before the --append run_end line is written
            summary.detections = detections.report()
        if detector is not None:
            summary.detector = detector.report()
        summary.coverage_unscored = coverage.unscored
    print(summary.human(), file=out, flush=True)
    if detections is not None:
        _report_unmatched(detections, settings.detections)
    if settings.jsonl:
        write_json_atomic(summary_path(settings.jsonl), summary.to_json())
    return summary, (str(grabber.error) if grabber.error is not None else None)


def _detections(settings: RunSettings):
    from edgecap.errors import EdgecapError

    from .detections import Detections

    coco_flags = (("--categories", settings.categories), ("--category-base", settings.category_base),
                  ("--min-score", settings.min_score))
    if not settings.detections:
        for flag, value in coco_flags if not settings.detector else ():
            if value is not None:
                raise EdgecapError(f"{flag} applies to a --detections file or a --detector; neither was given")
        return None
    min_score = DEFAULT_MIN_SCORE if settings.min_score is None else settings.min_score
    categories = None
    if settings.categories:
        from edgecap.data.coco_categories import load_categories

        categories = load_categories(settings.categories)
    detections = Detections(settings.detections, settings.area, min_score=min_score, categories=categories,
                            category_base=settings.category_base or "auto")
    given = [flag for flag, value in coco_flags if value is not None]
    if given and not detections.coco:
        raise EdgecapError(f"{given[0]} applies to COCO detection results; --detections {settings.detections} "
                           "is edgecap's JSON Lines, whose objects carry their class names")
    return detections


def _coverage_vocabulary(detections, detector=None):
    """The class set coverage reads captions against: a detector's classes, a COCO results file's
    categories (COCO's 80 or --categories FILE), else ACVR's 30 (ACVR, the synthetic world,
    edgecap's JSONL)."""
    if detector is not None:
        from .detector import coverage_vocabulary

        return coverage_vocabulary(detector)
    if detections is None or detections.categories is None:
        return None
    from edgecap.metrics.vocabulary import vocabulary_of

    categories = detections.categories
    return vocabulary_of(categories.names.values(), categories.origin)


def _report_unmatched(detections, path: str) -> None:
    """Detections of images the run never captioned: a misnamed folder or a results file for
    another split shows up here (and in summary.json) instead of as silently missing coverage."""
    from .detections import few_ids

    if detections.outside_note():
        _log(detections.outside_note())
    unmatched = detections.unmatched()
    if unmatched:
        _log(f"--detections {path}: {len(unmatched)} of {len(detections)} {detections.id_name} matched no "
             f"captioned frame ({few_ids(unmatched, 5)})")


def _check_out_mcap(path: str, source) -> None:
    """Fail before any slow start-up: an unwritable target, a file edgecap did not write, or
    the input log itself."""
    from pathlib import Path

    from edgecap.errors import EdgecapError
    from edgecap.ros.mcap_out import check_target

    target = Path(path).expanduser().resolve()
    log_path = getattr(source, "path", None)
    if log_path is not None and (target == Path(log_path).resolve()
                                 or Path(log_path).resolve() in target.parents):
        raise EdgecapError(f"--out-mcap {path} is the input log; write the captions to their "
                           "own file")
    check_target(path)


def run(args) -> int:
    from edgecap.errors import EdgecapError

    from .captioner import Captioner

    settings = settings_from_args(args)
    _check(settings)
    captioner = Captioner.from_bundle(settings.bundle, providers=settings.providers,
                                      threads=settings.threads, spin=settings.spin, engine=settings.engine)
    frontend = captioner.bundle.manifest.frontend
    if frontend is not None and frontend.random_weights:
        from edgecap.errors import random_front_end, warn

        warn(random_front_end(frontend.backbone, "its captions say nothing about the scene; "
                              "export the bundle with --visual-weights FILE"))
    summary, error = execute(captioner, settings)
    if error:
        raise EdgecapError(error)
    if summary.captioned == 0 and summary.stopped_by == "end of source":
        skipped = summary.to_json()["frames_skipped"]
        raise EdgecapError(f"--source {summary.source} ended without a frame captioned "
                           f"({skipped} frame{'s' * (skipped != 1)} could not be decoded)")
    if settings.jsonl:
        added = "appended" if settings.append else "lines"
        print(f"records: {settings.jsonl} ({summary.captioned} {added}); summary: "
              f"{summary_path(settings.jsonl)}")
    if settings.save_video and summary.captioned:
        print(f"video: {settings.save_video}")
    if settings.out_mcap:
        print(f"caption log: {settings.out_mcap} ({summary.captioned} captions)")
    if settings.rerun:
        print(f"rerun recording: {settings.rerun}")
    return 0


__all__ = ["RunSettings", "add_arguments", "execute", "read_config", "run", "settings_from_args"]
