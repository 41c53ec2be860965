"""One camera frame to one caption with coverage, per front end x captioner x backend x batch.

    python benchmarks/pipeline.py [--frontends mobilenet_v3_large,efficientnet_b0,resnet50,RN50,ViT-B-32,ViT-B-16,ViT-L-14]
        [--captioners smart,pma-edge,m2] [--backends torch,onnxruntime,onnxruntime-int8,tensorrt]
        [--batches 1,4] [--frames N] [--warmup N] [--threads N] [--image-size PX]
        [--detector MODEL.onnx] [--out DIR] [--workdir DIR] [--lock FILE] [--resume] [--quick] [--replot]

Every configuration is a real bundle (`edgecap export`: the front end's visual graph, the
captioner's encoder and decoder-step graphs; fp32 or dynamic int8) or, for `torch`, the same
checkpoint in PyTorch. Weights are random (front ends: their seeded initialisation; captioners:
the papers' sizes, 10,000 words, beam 3, at most 20 tokens, so captions run to full length: a
worst case). Each configuration runs in its own process, as a robot would run it: bundle rows
without torch importable (the robot install), on pre-rendered 640 x 480 frames of the synthetic
world whose objects are known, so coverage is scored as on the robot. Per row:

- time per stage of a batch (preprocess, visual, encoder, decode, coverage, and with
  `--detector` the object detector on the same frames, as `edgecap run --detector` runs it,
  whose objects coverage then scores): medians over `--frames` batches after `--warmup`; the
  total's p50 / p95 / p99;
- captions per second sustained under a 15 fps and a 30 fps camera with the run loop's
  newest-frame policy (a batch of B takes the newest frame of each of B cameras): the measured
  batch latencies replayed against the camera clock for 60 s, frames dropped counted;
- resident memory of the captioning process after the run (VmRSS) and its peak (VmHWM);
- the machine's 1-minute load average when the row's timing ends (above the thread count,
  something else was running: the row is slower than the configuration is);
- the bundle's size on disk.

With `--cameras 1,4` each bundle also runs the real multi-camera loop (edgecap.runtime.loop
.run_cameras, as `edgecap run --source A --source B ...`) for `--seconds`: C cameras at
`--camera-fps` (pre-rendered frames released on each camera's own clock, the cameras out of
phase), each round one batch of the newest frame of every camera. Per row: captions/s and drops
per camera, p50 / p99 capture-to-caption, and each stage of a round (preprocess, visual,
encoder, decode, coverage, the loop's own time) against its lower bound on this machine
(FLOPs at the measured fp32 matmul rate, bytes at the measured copy bandwidth; int8 weights
count a quarter) and against the camera's frame period. Written to OUT/pipeline_cameras.md and
the JSON's "camera_rows".

Writes OUT/pipeline.{json,csv,md} and OUT/pipeline_stages_b{B}.png (stacked stage bars).
`--quick` (the smallest front end at 64 px, one captioner at a small size, few frames) checks
the script end to end in well under a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, host_info, percentile, print_table, save_png, write_csv, write_json  # noqa: E402

from edgecap.argtypes import BATCH, COUNT, FRONTEND_SIDE, POSITIVE, THREADS, Integer, ListOf, Parser  # noqa: E402

FRONTENDS = ("mobilenet_v3_large", "efficientnet_b0", "resnet50", "RN50", "ViT-B-32", "ViT-B-16", "ViT-L-14")
CAPTIONERS = ("smart", "pma-edge", "m2")
BACKENDS = ("torch", "onnxruntime", "onnxruntime-int8", "tensorrt")
STAGES = ("preprocess", "visual", "encoder", "decode", "coverage")
ROW_STAGES = (*STAGES, "detector")  # a row's stages: --detector's beside the captioner's (0 without one)
STAGE_COLORS = ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red")
CAMERA_FPS = (15, 30)
FRAME_SHAPE = (480, 640)  # a 4:3 robot camera
BEAM, MAX_LEN, VOCAB = 3, 20, 10000


@dataclass(frozen=True)
class Config:
    frontend: str
    captioner: str
    backend: str
    batch: int

    @property
    def key(self) -> str:
        return f"{self.frontend}/{self.captioner}/{self.backend}/b{self.batch}"


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frontends", default=",".join(FRONTENDS))
    p.add_argument("--captioners", default=",".join(CAPTIONERS))
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--batches", type=ListOf(BATCH), default="1,4", help="1 = one camera; 4 = a 4-camera robot, one frame of each")
    p.add_argument("--frames", type=COUNT, default=20, help="timed batches per configuration")
    p.add_argument("--warmup", type=Integer(0), default=2)
    p.add_argument("--threads", type=THREADS, default=2, help="intra-op threads for torch and onnxruntime")
    p.add_argument("--image-size", type=FRONTEND_SIDE, default=0, help="front-end input size (default: the weights' own, 224)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "pipeline"))
    p.add_argument("--workdir", default="", help="keep checkpoints and bundles here and reuse them "
                                                 "(default: a temporary folder, emptied as the sweep goes)")
    p.add_argument("--timeout", type=POSITIVE, default=1800, help="seconds per configuration")
    p.add_argument("--lock", default="", help="hold this flock file while a (front end, captioner) group is timed "
                                              "(shared machines: exports need no lock, timings do)")
    p.add_argument("--quick", action="store_true", help="smallest front end at 64 px, a small captioner, few frames")
    p.add_argument("--replot", action="store_true", help="re-render plots and tables from OUT/pipeline.json")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows OUT/pipeline.json already holds (same settings) and measure the rest; "
                        "rows outside this sweep stay too, so a sweep can run in parts")
    p.add_argument("--cameras", type=ListOf(COUNT), default=None,
                   help="also run the multi-camera loop (edgecap run --source x C) with C cameras, e.g. 1,4: "
                        "one row per bundle (batch B) and C")
    p.add_argument("--camera-fps", type=POSITIVE, default=15.0, help="frame rate of each --cameras camera")
    p.add_argument("--seconds", type=POSITIVE, default=20.0, help="how long each --cameras row runs")
    p.add_argument("--detector", default="", metavar="MODEL.onnx",
                   help="also run this ONNX object detector on every batch (edgecap run --detector; e.g. "
                        "yolov3-tiny from tools/darknet_to_onnx.py): its own column, and coverage scores its objects")
    p.add_argument("--child", help=argparse.SUPPRESS)  # JSON job: measure one configuration in this process
    args = p.parse_args(argv)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    args.frontends, args.captioners, args.backends = split(args.frontends), split(args.captioners), split(args.backends)
    for name, given, valid in (("front end", args.frontends, FRONTENDS), ("captioner", args.captioners, CAPTIONERS),
                               ("backend", args.backends, BACKENDS)):
        for x in given:
            if x not in valid:
                p.error(f"unknown {name} {x!r}; choose from {', '.join(valid)}")
    if args.quick:
        args.frontends, args.captioners = ["mobilenet_v3_large"], ["smart"]
        args.backends = [b for b in args.backends if b != "onnxruntime-int8"] or ["onnxruntime"]
        args.frames, args.warmup, args.image_size = min(args.frames, 3), 1, 64
        args.seconds = min(args.seconds, 3.0)
    args.cameras = args.cameras or []
    return args


# -- checkpoints and bundles (parent process, torch) -------------------------------------------
def vocabulary(size: int) -> list[str]:
    """Specials, then GloVe's most frequent words: random captions of real words, so spaCy and
    the noun matcher do the work they do on the robot (filler words without edgecap[nlp])."""
    words: list[str] = []
    try:
        from edgecap.metrics.glove import load_glove

        words = [w for w in load_glove().words() if w.isalpha()][: size - 4]
    except ImportError:
        pass
    words += [f"w{i}" for i in range(size - 4 - len(words))]
    return ["<pad>", "<bos>", "<eos>", "<unk>", *words]


def captioner_overrides(name: str, quick: bool) -> dict:
    over = {"vocab_size": VOCAB, "max_len": MAX_LEN, "dropout": 0.0}
    if quick:
        over.update(d_model=64, n_heads=4, d_ff=128, vocab_size=500, max_len=8)
    return over


def checkpoint(frontend: str, captioner: str, args, workdir: Path) -> Path:
    import torch

    from edgecap.contract.vocab import Vocab
    from edgecap.models import build
    from edgecap.models.checkpoint import save_checkpoint
    from edgecap.models.frontends import frontend_overrides

    path = workdir / f"{frontend}-{captioner}.pt"
    if path.exists():
        return path
    torch.manual_seed(0)
    model = build(captioner, **captioner_overrides(captioner, args.quick),
                  **frontend_overrides(frontend, image_size=args.image_size)).eval()
    if model.cfg.decoder_self_attention == "prototype":
        # frozen random prototypes: the benchmark measures their cost, not their content
        g = torch.Generator().manual_seed(1)
        for layer in model.layers:
            m, d = layer.self_attn.proto_k.shape
            layer.self_attn.set_prototypes(torch.randn(m, d, generator=g), torch.randn(m, d, generator=g))
    save_checkpoint(path, model, Vocab(vocabulary(model.cfg.vocab_size)))
    return path


def bundle(cfg: Config, ckpt: Path, workdir: Path) -> tuple[Path | None, str]:
    """(bundle dir, "") or (None, why not)."""
    from edgecap.errors import EdgecapError
    from edgecap.export.bundle import export_bundle
    from edgecap.export.formats import resolve_settings

    engine = "trt" if cfg.backend == "tensorrt" else "onnx"
    if engine == "trt" and importlib.util.find_spec("tensorrt") is None:
        return None, "tensorrt is not installed: needs an NVIDIA GPU (Jetson Orin: export/jetson-orin-trt-fp16.toml)"
    precision = "int8" if cfg.backend.endswith("int8") else ("fp16" if engine == "trt" else "fp32")
    out = workdir / f"{cfg.frontend}-{cfg.captioner}-{engine}-{precision}-b{cfg.batch}"
    if not out.exists():
        settings = resolve_settings({"engine": engine, "batch": cfg.batch, "beam": BEAM, "precision": precision,
                                     "samples": 1, "out": str(out)})
        try:
            export_bundle(ckpt, settings, progress=False)
        except EdgecapError as exc:
            return None, str(exc).splitlines()[0][:160]
    return out, ""


def bundle_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / 2**20


# -- one configuration, measured in its own process ------------------------------------------
def frames_with_objects(n: int) -> list[tuple]:
    """n distinct 640 x 480 frames of the synthetic world and the objects in view."""
    import cv2

    from edgecap.data.synth import TabletopWorld
    from edgecap.runtime.sources import world_objects

    world = TabletopWorld(seed=7, size=FRAME_SHAPE[0], scene_seconds=0.2)
    out = []
    for t in range(n):
        image, objects = world.render_frame(t * 5)
        known = world_objects(objects, image.shape[1], image.shape[0])  # box areas, as edgecap run
        out.append((cv2.resize(image, FRAME_SHAPE[::-1], interpolation=cv2.INTER_LINEAR), known))
    return out


def memory_mb() -> dict:
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return {"rss_mb": out.get("VmRSS"), "peak_rss_mb": out.get("VmHWM")}


class TorchPipeline:
    """The checkpoint in PyTorch, staged as the runtime stages a bundle."""

    def __init__(self, ckpt: Path, threads: int):
        import torch

        from edgecap.models.checkpoint import load_checkpoint

        torch.set_num_threads(threads)
        self.torch = torch
        self.ckpt = load_checkpoint(ckpt)
        self.pre = self.ckpt.config.visual.preprocessing()

    def caption(self, frames):
        import time

        import numpy as np

        from edgecap.contract.beam import DecodeOptions, beam_search
        from edgecap.contract.preprocess import preprocess_as
        from edgecap.models.decoding import CachedStepper

        model, cfg, torch = self.ckpt.model, self.ckpt.config, self.torch
        t0 = time.perf_counter()
        images = torch.from_numpy(np.stack([preprocess_as(f, self.pre) for f in frames]))
        t1 = time.perf_counter()
        with torch.no_grad():
            feats, mask = model.visual(images)
            t2 = time.perf_counter()
            cross = model.encode(feats, mask)
            t3 = time.perf_counter()
            stepper = CachedStepper(model, cross, len(frames) * BEAM)  # cross stays at the image batch
            hyp = beam_search(stepper, len(frames), DecodeOptions(beam_size=BEAM, max_len=cfg.max_len),
                              cfg.bos_id, cfg.eos_id, cfg.pad_id)
        texts = [" ".join(self.ckpt.vocab.decode([int(t) for t in row[0][:n[0]]]))
                 for row, n in zip(np.asarray(hyp.tokens), np.asarray(hyp.lengths), strict=True)]
        t4 = time.perf_counter()
        stages = {"preprocess": t1 - t0, "visual": t2 - t1, "encoder": t3 - t2, "decode": t4 - t3}
        return texts, {k: v * 1e3 for k, v in stages.items()}


class BundlePipeline:
    """The bundle through edgecap.runtime, exactly as `edgecap run` captions."""

    def __init__(self, path: Path, threads: int):
        from edgecap.runtime.captioner import Captioner

        self.captioner = Captioner.from_bundle(path, beam=BEAM, threads=threads, providers=["CPUExecutionProvider"])

    def caption(self, frames):
        caps = self.captioner.caption(frames)
        return [c.text for c in caps], dict(caps[0].latency_ms)


def measure(job: dict) -> dict:
    """Time `job["frames"]` batches of one configuration after warm-up, coverage included."""
    import time

    from edgecap.runtime.scoring import CoverageAnnotator

    batch = int(job["batch"])
    if job["backend"] == "torch":
        pipeline = TorchPipeline(Path(job["checkpoint"]), job["threads"])
    else:
        pipeline = BundlePipeline(Path(job["bundle"]), job["threads"])
    detector = None
    if job.get("detector"):  # the captioner's own threads budget and provider, as edgecap run opens it
        from edgecap.runtime.detector import Detector, coverage_vocabulary

        detector = Detector.load(job["detector"], providers=["CPUExecutionProvider"], threads=job["threads"])
        detector.warm_up()
    coverage = CoverageAnnotator(log=lambda *_: None,
                                 vocabulary=None if detector is None else coverage_vocabulary(detector))
    coverage.warm_up()
    pool = frames_with_objects(max(8, batch * 2))
    stages: dict[str, list[float]] = {s: [] for s in ROW_STAGES}
    totals, scores, sample = [], [], ""
    for i in range(job["warmup"] + job["frames"]):
        chosen = [pool[(i * batch + c) % len(pool)] for c in range(batch)]  # one frame per camera
        texts, ms = pipeline.caption([image for image, _ in chosen])
        if detector is not None:  # its objects replace the world's, as in edgecap run --detector
            found = detector.detect([image for image, _ in chosen])
            ms["detector"] = detector.latency_ms
            chosen = [(image, objects) for (image, _), objects in zip(chosen, found, strict=True)]
        t0 = time.perf_counter()
        scored = [coverage.score(text, objects) for text, (_, objects) in zip(texts, chosen, strict=True)]
        ms["coverage"] = (time.perf_counter() - t0) * 1e3
        if i < job["warmup"]:
            continue
        for s in ROW_STAGES:
            stages[s].append(ms.get(s, 0.0))
        totals.append(sum(ms.get(s, 0.0) for s in ROW_STAGES))
        # None: no object above the threshold (a frame the detector finds empty)
        scores += [s[0][">1%"] for s in scored if s is not None and s[0].get(">1%") is not None]
        sample = texts[0]
    return {"stage_ms": {s: percentile(v, 50) for s, v in stages.items()}, "totals_ms": totals,
            "coverage_on": coverage.enabled, "mean_coverage": sum(scores) / len(scores) if scores else None,
            "sample_caption": sample, "load_1m": os.getloadavg()[0], **memory_mb()}


def run_child(job: dict, timeout: float, nice: int = 0) -> dict:
    """`measure(job)` (or, for a "prepare" job, the exports) in a fresh interpreter: its memory
    is the configuration's own. Bundle rows run where torch cannot be imported, as on a robot
    with `pip install edgecap[nlp]`."""
    import os

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        result_path = Path(f.name)
    job = {**job, "result": str(result_path)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(job)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=(lambda: os.nice(nice)) if nice else None)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
            return {"status": "failed", "reason": lines[-1][:200]}
        return {"status": "ok", **json.loads(result_path.read_text())}
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout:.0f} s"}
    finally:
        result_path.unlink(missing_ok=True)


def child_main(spec: str) -> int:
    job = json.loads(spec)
    if "prepare" in job:
        frontend, captioner, group = job["prepare"]
        args = argparse.Namespace(quick=job["quick"], image_size=job["image_size"], cameras=job.get("cameras", []))
        result = prepare_group(frontend, captioner, [Config(**c) for c in group], args, Path(job["workdir"]))
        Path(job["result"]).write_text(json.dumps(result))
        return 0
    if "rates" in job:
        from _roofline import matmul_throughput, memory_bandwidth

        small = job.get("quick", False)  # a smoke test: small arrays, the rates roughly
        result = {"bandwidth": memory_bandwidth(mbytes=32 if small else 256, repeats=2 if small else 5, threads=job["rates"]),
                  "flops": matmul_throughput(n=256 if small else 1024, repeats=2 if small else 5, threads=job["rates"])}
        Path(job["result"]).write_text(json.dumps(result))
        return 0
    if job["backend"] != "torch":
        sys.modules["torch"] = None  # the robot install: `import torch` fails, as without the package
    result = measure_cameras(job) if "cameras" in job else measure(job)
    Path(job["result"]).write_text(json.dumps(result))
    return 0


# -- several cameras, one process (edgecap.runtime.loop.run_cameras) ----------------------------
class ReplayCamera:
    """A camera of pre-rendered frames: the loop's FrameGrabber releases them at `fps` (pace
    native), as a device would, starting `phase` seconds late so that cameras are out of step."""

    live, timed = False, False

    def __init__(self, pool: list[tuple], fps: float, phase: float, name: str):
        self.pool, self.fps, self.phase, self.name = pool, fps, phase, name
        self.position = 0

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def read(self):
        import time

        from edgecap.runtime.sources import Captured

        if self.position == 0 and self.phase:
            time.sleep(self.phase)
        image, objects = self.pool[self.position % len(self.pool)]
        self.position += 1
        return Captured(image, self.position - 1, objects)


class TimedCoverage:
    """The run's CoverageAnnotator, timing each score (the coverage stage of a round)."""

    def __init__(self, annotator):
        self.annotator, self.ms = annotator, []

    def score(self, caption, objects):
        import time

        t0 = time.perf_counter()
        try:
            return self.annotator.score(caption, objects)
        finally:
            self.ms.append((time.perf_counter() - t0) * 1e3)


def measure_cameras(job: dict) -> dict:
    """`job["cameras"]` cameras through one bundle for `job["seconds"]`, as `edgecap run` with
    several sources: -> per camera and per round figures (the first second left out)."""
    import threading
    import time

    from edgecap.runtime.camera import FrameGrabber
    from edgecap.runtime.loop import Camera, LoopOptions, run_cameras
    from edgecap.runtime.records import Summary
    from edgecap.runtime.scoring import CoverageAnnotator

    n, fps = int(job["cameras"]), float(job["camera_fps"])
    captioner = BundlePipeline(Path(job["bundle"]), job["threads"]).captioner
    coverage = TimedCoverage(CoverageAnnotator(log=lambda *_: None))
    captioner.warm_up()
    coverage.annotator.warm_up()
    pool = frames_with_objects(8)
    fresh, stop = threading.Event(), threading.Event()
    cameras = []
    for c in range(n):
        source = ReplayCamera(pool[c:] + pool[:c], fps, phase=c / (n * fps), name=f"camera{c}")
        grabber = FrameGrabber(source, pace="native", on_publish=lambda frame: fresh.set())
        summary = Summary(source.name, camera=c)
        summary.grabber = grabber.stats
        cameras.append(Camera(c, grabber, summary))
    total = Summary("cameras", cameras=[c.summary for c in cameras])
    records = []
    t_start = time.monotonic()
    for camera in cameras:
        camera.grabber.start()
    timer = threading.Timer(job["seconds"], stop.set)
    timer.start()
    try:
        run_cameras(captioner, cameras, total, [records.append], LoopOptions(), stop, fresh, coverage=coverage)
    finally:
        timer.cancel()
        for camera in cameras:
            camera.grabber.close()
    t_end = time.monotonic()
    settle = t_start + 1.0  # the first second: cameras starting, caches filling
    kept = [r for r in records if r.frame.t_capture >= settle]
    rounds: dict[float, list] = {}
    for r in kept:
        rounds.setdefault(r.t_done, []).append(r)
    span = t_end - settle
    # a round of more cameras than the bundle's batch is several batches: add their stages up
    batches = [{tuple(r.caption.latency_ms.items()) for r in group} for group in rounds.values()]
    stage_ms = {s: percentile([sum(dict(b)[s] for b in bs) for bs in batches], 50) if batches else 0.0
                for s in STAGES[:-1]}
    cov_of = {id(r): ms for r, ms in zip(records, coverage.ms, strict=True)}  # one score per record, in order
    stage_ms["coverage"] = percentile([sum(cov_of[id(r)] for r in group) for group in rounds.values()], 50) \
        if rounds else 0.0
    per_camera = []
    for camera in cameras:
        mine = [r for r in kept if r.camera == camera.name]
        lat = [r.capture_to_caption_ms for r in mine]
        g = camera.grabber.stats
        per_camera.append({"camera": camera.name, "captions_per_s": len(mine) / span,
                           "dropped_pct": 100.0 * g.dropped / max(1, g.captured),
                           "p50_ms": percentile(lat, 50) if lat else None, "p99_ms": percentile(lat, 99) if lat else None})
    latencies = [r.capture_to_caption_ms for r in kept]
    return {"per_camera": per_camera, "captions_per_s": len(kept) / span, "round_ms": 1e3 * span / max(1, len(rounds)),
            "rows_per_round": len(kept) / max(1, len(rounds)), "stage_ms": stage_ms,
            "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
            "dropped_pct": 100.0 * sum(c.grabber.stats.dropped for c in cameras) / max(1, sum(c.grabber.stats.captured for c in cameras)),
            "load_1m": os.getloadavg()[0], **memory_mb()}


# -- the camera --------------------------------------------------------------------------------
def sustained(totals_ms: list[float], fps: float, seconds: float = 60.0) -> dict:
    """Replay batch latencies against a camera clock with the newest-frame policy.

    Frame k of every camera arrives at k / fps. When the captioner is free it takes the newest
    frame not yet captioned (waiting for the next one if it has seen the newest); frames that
    arrived meanwhile are dropped. -> captions per second per camera, share of frames dropped,
    median capture-to-caption latency (waiting for a frame + the batch's own time).
    """
    if not totals_ms:
        return {}
    t, last, done, ages, i = 0.0, -1, 0, [], 0
    while True:
        newest = math.floor(t * fps + 1e-9)
        if newest <= last:  # seen it: wait for the next frame
            newest, t = last + 1, (last + 1) / fps
        if t >= seconds:
            break
        t += totals_ms[i % len(totals_ms)] / 1e3
        ages.append((t - newest / fps) * 1e3)
        last, done, i = newest, done + 1, i + 1
    arrived = math.floor(t * fps + 1e-9) + 1  # frames 0 .. floor(t * fps) of each camera
    return {"captions_per_s": done / t, "dropped_pct": 100.0 * (arrived - done) / max(1, arrived),
            "capture_to_caption_p50_ms": percentile(ages, 50)}


# -- the sweep -----------------------------------------------------------------------------------
def prepare_group(frontend: str, captioner: str, group: list[Config], args, workdir: Path) -> dict:
    """Checkpoint and bundles of one (front end, captioner), exported in this process:
    -> {"checkpoint": path} and per config key {"bundle": path} or {"reason": why not}."""
    out: dict = {"checkpoint": str(checkpoint(frontend, captioner, args, workdir))}
    for cfg in group:
        if cfg.backend != "torch":
            path, reason = bundle(cfg, Path(out["checkpoint"]), workdir)
            out[cfg.key] = {"bundle": str(path)} if path else {"reason": reason}
            if path and args.cameras:
                out[cfg.key]["cost"] = round_cost(Path(out["checkpoint"]), cfg.batch)
    return out


def round_cost(ckpt: Path, batch: int) -> dict:
    """FLOPs of the visual and encoder graphs for `batch` images, the bytes and FLOPs of one
    beam-BEAM decode step, and the bytes preprocessing moves (torch's flop counter, the model
    itself: _roofline.step_cost)."""
    import torch
    from _roofline import step_cost
    from torch.utils.flop_counter import FlopCounterMode

    from edgecap.models.checkpoint import load_checkpoint

    model = load_checkpoint(ckpt).model.eval()
    size = int(model.cfg.visual.preprocessing()["size"])
    images = torch.zeros(batch, 3, size, size)
    with torch.no_grad(), FlopCounterMode(display=False) as visual:
        feats, mask = model.visual(images)
    with torch.no_grad(), FlopCounterMode(display=False) as encoder:
        model.encode(feats, mask, *model.encode_extra_example(batch))
    frame_bytes = FRAME_SHAPE[0] * FRAME_SHAPE[1] * 3 + 3 * size * size * 4  # read uint8, write fp32
    return {"visual_flops": visual.get_total_flops(), "encoder_flops": encoder.get_total_flops(),
            "step": step_cost(model, batch, BEAM), "max_len": int(model.cfg.max_len),
            "preprocess_bytes": batch * frame_bytes}


def run_prepare(frontend: str, captioner: str, group: list[Config], args, workdir: Path) -> dict:
    """`prepare_group` in a child at the lowest CPU priority: exports take minutes (a ViT-L
    visual graph is 1.2 GB) and need no quiet machine, so they hold no lock and yield the CPU to
    measurements, ours and other people's."""
    job = {"prepare": [frontend, captioner, [asdict(c) for c in group]], "workdir": str(workdir),
           "quick": args.quick, "image_size": args.image_size, "cameras": args.cameras}
    return run_child(job, args.timeout * 4, nice=19)


def measure_config(cfg: Config, prepared: dict, args) -> dict:
    row = asdict(cfg)
    if prepared.get("status") != "ok":
        return {**row, "status": "failed", "reason": f"export: {prepared.get('reason', '')}"}
    ckpt = Path(prepared["checkpoint"])
    job = {"backend": cfg.backend, "batch": cfg.batch, "frames": args.frames, "warmup": args.warmup,
           "threads": args.threads, "checkpoint": str(ckpt), "detector": args.detector}
    if cfg.backend != "torch":
        made = prepared[cfg.key]
        if "bundle" not in made:
            return {**row, "status": "skipped", "reason": made["reason"]}
        job["bundle"] = made["bundle"]
        row["bundle_mb"] = bundle_mb(Path(made["bundle"]))
    else:
        row["bundle_mb"] = ckpt.stat().st_size / 2**20  # the checkpoint a torch deployment carries
    result = run_child(job, args.timeout)
    if result["status"] != "ok":
        return {**row, **result}
    totals = result.pop("totals_ms")
    out = {**row, "status": "ok", **{f"{s}_ms": v for s, v in result.pop("stage_ms").items()},
           "total_p50_ms": percentile(totals, 50), "total_p95_ms": percentile(totals, 95),
           "total_p99_ms": percentile(totals, 99), "ms_per_frame": percentile(totals, 50) / cfg.batch,
           "frames": len(totals), **result}
    for fps in CAMERA_FPS:
        for key, value in sustained(totals, fps).items():
            out[f"cam{fps}_{key}"] = value
    return out


def machine_rates(args) -> dict:
    """Copy bandwidth (bytes/s) and fp32 matmul rate (FLOP/s) at --threads, measured here."""
    return run_child({"rates": args.threads, "quick": args.quick}, args.timeout)


def camera_bounds(cost: dict, rates: dict, backend: str, batches: int) -> dict:
    """The lower bound of each stage of a round of `batches` static batches, in ms."""
    from _roofline import step_bound_seconds

    scale = 0.25 if backend.endswith("int8") else 1.0  # int8 weights: a quarter of the bytes
    step = step_bound_seconds(cost["step"], rates["bandwidth"], rates["flops"], scale)
    return {k: 1e3 * batches * v for k, v in (("preprocess", cost["preprocess_bytes"] / rates["bandwidth"]),
                                                 ("visual", cost["visual_flops"] / rates["flops"]),
                                                 ("encoder", cost["encoder_flops"] / rates["flops"]),
                                                 ("decode", step * cost["max_len"]))}


def measure_cameras_config(cfg: Config, cameras: int, prepared: dict, rates: dict, args) -> dict:
    row = {**asdict(cfg), "cameras": cameras, "camera_fps": args.camera_fps}
    made = prepared.get(cfg.key, {}) if prepared.get("status") == "ok" else {}
    if "bundle" not in made:
        return {**row, "status": "skipped", "reason": made.get("reason", prepared.get("reason", "export failed"))}
    job = {"backend": cfg.backend, "bundle": made["bundle"], "threads": args.threads, "cameras": cameras,
           "camera_fps": args.camera_fps, "seconds": args.seconds}
    result = run_child(job, args.timeout)
    if result["status"] != "ok":
        return {**row, **result}
    batches = -(-cameras // cfg.batch)
    bounds = camera_bounds(made["cost"], rates, cfg.backend, batches) if "cost" in made else {}
    per_camera = result.pop("per_camera")
    out = {**row, "status": "ok", "batches_per_round": batches, "per_camera": per_camera,
           **{f"{k}_ms": v for k, v in result.pop("stage_ms").items()},
           **{f"{k}_bound_ms": v for k, v in bounds.items()}, **result,
           "frame_period_ms": 1e3 / args.camera_fps,
           "min_camera_captions_per_s": min(c["captions_per_s"] for c in per_camera),
           "max_camera_dropped_pct": max(c["dropped_pct"] for c in per_camera)}
    out["other_ms"] = max(0.0, out["round_ms"] - sum(out[f"{s}_ms"] for s in STAGES))
    return out


CAMERA_COLUMNS = [("frontend", "front end", "s"), ("captioner", "captioner", "s"), ("backend", "backend", "s"),
                  ("batch", "B", "d"), ("cameras", "cams", "d"), ("captions_per_s", "cap/s", ".1f"),
                  ("min_camera_captions_per_s", "cap/s per cam (min)", ".2f"),
                  ("max_camera_dropped_pct", "drop% (max cam)", ".0f"), ("p50_ms", "p50", ".0f"),
                  ("p99_ms", "p99", ".0f"), ("round_ms", "round", ".1f"), ("rows_per_round", "frames/round", ".2f"),
                  ("rss_mb", "RSS MB", ".0f"), ("load_1m", "load", ".1f")]


def camera_markdown(rows: list[dict]) -> str:
    """Two tables: the loop's figures, then each stage of a round against its bound."""
    ok = [r for r in rows if r["status"] == "ok"]
    lines = ["| " + " | ".join(h for _, h, _ in CAMERA_COLUMNS) + " |", "|" + "---|" * len(CAMERA_COLUMNS)]
    for r in ok:
        lines.append("| " + " | ".join("-" if r.get(k) is None else format(r[k], spec) for k, _, spec in CAMERA_COLUMNS) + " |")
    lines += ["", "ms per round, measured (lower bound on this machine; `-`: none computed); the frame period "
              "is the budget of a round when every camera is in one batch:", "",
              "| front end | captioner | backend | B | cams | " + " | ".join(STAGES) + " | idle + loop | round | frame period |",
              "|" + "---|" * (len(STAGES) + 8)]
    for r in ok:
        cells = [f"{r[f'{s}_ms']:.1f} ({'-' if r.get(f'{s}_bound_ms') is None else format(r[f'{s}_bound_ms'], '.1f')})"
                 for s in STAGES]
        lines.append(f"| {r['frontend']} | {r['captioner']} | {r['backend']} | {r['batch']} | {r['cameras']} | "
                     + " | ".join(cells) + f" | {r['other_ms']:.1f} | {r['round_ms']:.1f} | {r['frame_period_ms']:.1f} |")
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"- {r['frontend']}/{r['captioner']}/{r['backend']}/b{r['batch']} x {r['cameras']} cameras "
                         f"{r['status']}: {r.get('reason', '')}")
    return "\n".join(lines) + "\n"


def remove_group(prepared: dict, workdir: Path) -> None:
    """Delete what `prepare_group` wrote (a sweep's bundles would fill a disk)."""
    import shutil

    for value in prepared.values():
        if isinstance(value, dict) and value.get("bundle"):
            path = Path(value["bundle"])
            if path.parent == workdir:
                shutil.rmtree(path, ignore_errors=True)
    if prepared.get("checkpoint") and Path(prepared["checkpoint"]).parent == workdir:
        Path(prepared["checkpoint"]).unlink(missing_ok=True)


@contextlib.contextmanager
def exclusive(lock: str):
    """flock(2) on `lock` for the duration (nothing when no lock file is named)."""
    if not lock:
        yield
        return
    import fcntl

    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def configs(args) -> list[Config]:
    return [Config(f, c, b, n) for f in args.frontends for c in args.captioners for b in args.backends
            for n in args.batches]


def plot(rows: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for batch in sorted({r["batch"] for r in rows if r["status"] == "ok"}):
        ok = [r for r in rows if r["status"] == "ok" and r["batch"] == batch]
        fig, ax = plt.subplots(figsize=(9, 0.28 * len(ok) + 1.6))
        labels = [f"{r['frontend']} · {r['captioner']} · {r['backend']}" for r in ok]
        left = [0.0] * len(ok)
        for stage, color in zip(ROW_STAGES, STAGE_COLORS, strict=True):
            values = [r.get(f"{stage}_ms") or 0.0 for r in ok]  # rows measured before --detector lack its stage
            ax.barh(range(len(ok)), values, left=left, color=color, label=stage)
            left = [a + b for a, b in zip(left, values, strict=True)]
        ax.set_yticks(range(len(ok)), labels, fontsize=7)
        ax.invert_yaxis()
        # linear: on a log axis a stacked bar's first segment looks like most of the total
        ax.set_xlabel(f"ms per batch of {batch} frame{'s' if batch > 1 else ''} (median per stage)")
        ax.set_title(f"frame to caption with coverage, batch {batch}")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        written.append(save_png(fig, out / f"pipeline_stages_b{batch}.png"))
    return written


COLUMNS = [("frontend", "front end", "s"), ("captioner", "captioner", "s"), ("backend", "backend", "s"),
           ("batch", "B", "d"), ("preprocess_ms", "pre", ".1f"), ("visual_ms", "visual", ".1f"),
           ("encoder_ms", "enc", ".1f"), ("decode_ms", "decode", ".1f"), ("coverage_ms", "cov", ".1f"),
           ("detector_ms", "det", ".1f"),
           ("total_p50_ms", "p50", ".0f"), ("total_p95_ms", "p95", ".0f"), ("total_p99_ms", "p99", ".0f"),
           ("cam15_captions_per_s", "cap/s@15", ".2f"), ("cam15_dropped_pct", "drop%@15", ".0f"),
           ("cam30_captions_per_s", "cap/s@30", ".2f"), ("cam30_dropped_pct", "drop%@30", ".0f"),
           ("rss_mb", "RSS MB", ".0f"), ("bundle_mb", "size MB", ".0f"), ("load_1m", "load", ".1f")]


def markdown(rows: list[dict]) -> str:
    head = "| " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * len(COLUMNS)]
    for r in rows:
        if r["status"] != "ok":
            continue
        lines.append("| " + " | ".join("-" if r.get(k) is None else format(r[k], spec) for k, _, spec in COLUMNS) + " |")
    skipped = sorted({(r["backend"], r.get("reason", "")) for r in rows if r["status"] != "ok"})
    if skipped:
        lines.append("")
        lines += [f"- `{b}` rows {('skipped' if 'tensorrt' in b else 'not measured')}: {why}" for b, why in skipped]
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, out: Path) -> None:
    from edgecap.io import write_text_atomic

    rows = report["rows"]
    write_json(out / "pipeline.json", report)
    write_csv(out / "pipeline.csv", rows)
    write_text_atomic(out / "pipeline.md", markdown(rows))
    if report.get("camera_rows"):
        write_text_atomic(out / "pipeline_cameras.md", camera_markdown(report["camera_rows"]))
        print(f"wrote {out / 'pipeline_cameras.md'}")
    for path in plot(rows, out):
        print(f"wrote {path}")
    print(f"wrote {out / 'pipeline.json'}, pipeline.csv, pipeline.md")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        write_outputs(json.loads((out / "pipeline.json").read_text()), out)
        return 0
    from edgecap.progress import progress_bar

    keep = bool(args.workdir)
    workdir = Path(args.workdir) if keep else Path(tempfile.mkdtemp(prefix="edgecap-pipeline-"))
    workdir.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("child", "replot", "lock", "resume", "workdir")}
    report = {"host": host_info(), "settings": settings, "beam": BEAM, "frame": list(FRAME_SHAPE), "rows": [],
              "camera_rows": []}
    rates: dict = {}  # measured under the lock with the first group's timings
    done = previous_rows(out / "pipeline.json", settings) if args.resume else {}
    todo = configs(args)
    groups: dict[tuple[str, str], list[Config]] = {}
    for cfg in todo:
        groups.setdefault((cfg.frontend, cfg.captioner), []).append(cfg)
    rows = report["rows"]
    # rows of earlier parts of the sweep (other front ends, captioners, ...) stay in the report,
    # also when this part is interrupted
    rows += [row for key, row in done.items() if key not in {c.key for c in todo}]
    try:
        with progress_bar(total=len(todo), desc="pipeline", unit="config") as bar:
            for (frontend, captioner), group in groups.items():
                kept = [done[c.key] for c in group if c.key in done]
                rows += kept
                bar.update(len(kept))
                group = [c for c in group if c.key not in done]
                if not group:
                    continue
                bar.set_postfix_str(f"export {frontend}/{captioner}")
                prepared = run_prepare(frontend, captioner, group, args, workdir)
                with exclusive(args.lock):  # one wait per group, not per row, on a shared machine
                    if args.cameras and not rates:
                        rates = machine_rates(args)
                        if rates.get("status") != "ok":
                            raise SystemExit(f"measuring this machine's rates failed: {rates.get('reason')}")
                        report["rates"] = {"bandwidth_gb_s": rates["bandwidth"] / 1e9,
                                           "fp32_gflop_s": rates["flops"] / 1e9}
                    for cfg in group:
                        bar.set_postfix_str(cfg.key)
                        rows.append(measure_config(cfg, prepared, args))
                        for cameras in args.cameras if cfg.backend != "torch" else ():
                            bar.set_postfix_str(f"{cfg.key} x {cameras} cameras")
                            report["camera_rows"].append(measure_cameras_config(cfg, cameras, prepared, rates, args))
                        bar.update()
                if not keep:
                    remove_group(prepared, workdir)
                report["complete"] = False
                write_json(out / "pipeline.json", report)  # an interrupted sweep keeps what it measured
    finally:
        if not keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    rows.sort(key=table_order)
    report["complete"] = True
    write_outputs(report, out)
    brief = ("total_p50_ms", "total_p95_ms", "total_p99_ms", "cam15_captions_per_s", "rss_mb")
    print_table([r for r in rows if r["status"] == "ok"], COLUMNS[:4] + [c for c in COLUMNS if c[0] in brief])
    if report["camera_rows"]:
        print_table([r for r in report["camera_rows"] if r["status"] == "ok"], CAMERA_COLUMNS[:11])
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['status']}: {Config(r['frontend'], r['captioner'], r['backend'], r['batch']).key}: {r['reason']}")
    return 0


def table_order(row: dict) -> tuple:
    return (FRONTENDS.index(row["frontend"]), CAPTIONERS.index(row["captioner"]), BACKENDS.index(row["backend"]),
            row["batch"])


def previous_rows(path: Path, settings: dict) -> dict:
    """Rows of an earlier run with the same measurement settings, by configuration key."""
    if not path.is_file():
        return {}
    old = json.loads(path.read_text())
    same = ("frames", "warmup", "threads", "image_size", "quick", "detector")
    if any(old.get("settings", {}).get(k) != settings.get(k) for k in same):
        raise SystemExit(f"--resume: {path} was measured with other settings "
                         f"({ {k: old.get('settings', {}).get(k) for k in same} })")
    return {Config(r["frontend"], r["captioner"], r["backend"], r["batch"]).key: r for r in old["rows"]
            if r["status"] in ("ok", "skipped")}


if __name__ == "__main__":
    sys.exit(main())
