"""A front end's visual graph, fp32 against static int8, timed in turns.

    python benchmarks/front_end_int8.py FP32_BUNDLE INT8_BUNDLE [FP32_BUNDLE INT8_BUNDLE ...]
        [--runs 30] [--warmup 3] [--threads 2] [--out DIR]

Each pair is two bundles exported from the same checkpoint (`edgecap export --precision fp32`
and `--target cpu-ort-int8`). Their visual graphs run on the same preprocessed synthetic-world
frames through `edgecap.runtime` (the bundle's own onnxruntime settings), alternating one run of
each, so a machine shared with other work slows both alike and the ratio holds where the
absolute times do not. Reports the medians, the speed-up and the int8 bundle's own export-time
record (`parity.onnxruntime.front_end_int8`: feature cosine plain and centred, how alike
different images' features are). Writes OUT/front_end_int8.{json,md}.
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
    p.add_argument("bundles", nargs="+", help="pairs: FP32_BUNDLE INT8_BUNDLE ...")
    p.add_argument("--runs", type=COUNT, default=30, help="timed runs of each graph")
    p.add_argument("--warmup", type=Integer(0), default=3)
    p.add_argument("--threads", type=THREADS, default=2)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "front_end_int8"))
    args = p.parse_args(argv)
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


def main(argv=None) -> int:
    from edgecap.io import write_text_atomic

    args = parse_args(argv)
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
