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
from dataclasses import dataclass, fields
from pathlib import Path

from edgecap.argtypes import BATCH, BEAM, COUNT, FRACTION, POSITIVE, THREADS
from edgecap.contract.objects import AREAS
from edgecap.data.coco_categories import CATEGORY_BASES
from edgecap.errors import EdgecapError, did_you_mean, random_front_end, warn
from edgecap.jsonio import read_toml

from .coco_results import DEFAULT_MIN_SCORE
from .detector import DEFAULT_IOU
from .detector import DEFAULT_MIN_SCORE as DETECTOR_MIN_SCORE
from .execute import execute, plan_run
from .records import summary_path


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
    value = written
    if _names_a_path(written) and not Path(written).expanduser().is_absolute():
        # joined, not resolved: a camera's /dev/v4l/by-id link must stay the name reopened
        value = os.path.abspath(config.parent / Path(written).expanduser())
    if _names_a_path(written):
        _check_config_relative(config, "source", written, value)
    return value


def _names_a_path(source: str) -> bool:
    """A source string that is a file or folder, not a camera index or a URL (synth://, rtsp://)."""
    text = source.strip()
    return bool(text) and not text.isdigit() and "://" not in text


def _check_config_relative(config, key: str, written: str, resolved: str) -> None:
    """A relative input path of a config that is missing beside the config but present from the
    current directory was written for the other rule: say so in one line instead of failing
    later on a path the user never typed (or, worse, taking the other file)."""
    here = Path(written).expanduser()
    if here.is_absolute() or Path(resolved).exists() or not here.exists():
        return
    raise EdgecapError(f"--config {config}: {key} = {written!r} is relative to the config's folder, and "
                       f"{resolved} does not exist ({here.resolve()} does: write that path in the config)")


def settings_from_args(args) -> RunSettings:
    """Defaults < --config file < flags given on the command line."""
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


def run(args) -> int:
    from .captioner import Captioner

    settings = settings_from_args(args)
    plan = plan_run(settings)  # every check that needs no bundle, before the slow load
    captioner = Captioner.from_bundle(settings.bundle, providers=settings.providers,
                                      threads=settings.threads, spin=settings.spin, engine=settings.engine)
    frontend = captioner.bundle.manifest.frontend
    if frontend is not None and frontend.random_weights:
        warn(random_front_end(frontend.backbone, "its captions say nothing about the scene; "
                              "export the bundle with --visual-weights FILE"))
    summary, error = execute(captioner, settings, plan=plan)
    if error:
        raise EdgecapError(error)
    _refuse_sources_that_gave_nothing(summary)
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


def _refuse_sources_that_gave_nothing(summary) -> None:
    """One rule for one source or several: a source that reached its end without a single frame
    captioned (every frame undecodable, an empty folder) fails the run, exit 1, naming it; the
    others' records and the summary are written first."""
    empty = [s for s in summary.cameras or [summary] if s.captioned == 0 and s.stopped_by == "end of source"]
    if not empty:
        return
    problems = []
    for source in empty:
        skipped = source.to_json()["frames_skipped"]
        problems.append(f"--source {source.source} ended without a frame captioned "
                        f"({skipped} frame{'s' * (skipped != 1)} could not be decoded)")
    raise EdgecapError("; ".join(problems))


__all__ = ["RunSettings", "add_arguments", "execute", "read_config", "run", "settings_from_args"]
