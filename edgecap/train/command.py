"""`edgecap train --config CONFIG.toml [--data DIR] [--set KEY=VALUE ...] [--out DIR] [--resume]
[--max-steps N] [--device cpu|cuda]`; `edgecap train --resume RUN_DIR` continues a run with the
config it keeps (RUN_DIR/config.toml).

Multi-GPU (or multi-process CPU) training is the same command under torchrun:
    torchrun --nproc_per_node=2 -m edgecap.cli train --config CONFIG.toml
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from edgecap.argtypes import COUNT
from edgecap.errors import EdgecapError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None,
                        help="training config (TOML), e.g. configs/demo-tabletop.toml (default with --resume RUN_DIR: "
                             "RUN_DIR/config.toml). Relative paths in it (data, index, weights) are relative "
                             "to the directory the run starts in, not to the config file's folder (unlike "
                             "edgecap run --config: docs/training.md); --resume and export keep reading "
                             "them from there")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help="train on this dataset folder instead of the config's data: dataset_coco.json "
                             "plus images/ (as edgecap data synth writes) or, for a model that reads features, "
                             "its HDF5 file (the config's file name, or the folder's only .h5 / .hdf5; "
                             "--set data.features=FILE after --data names another)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change one config value, dotted key, checked against the config's type "
                             "(e.g. --set schedule.epochs=3 --set model.memory.slots=8); repeatable")
    parser.add_argument("--out", default=None, help="run directory (default: [run].out or runs/<config name>)")
    parser.add_argument("--resume", nargs="?", const="", default=None, metavar="RUN_DIR",
                        help="continue a run exactly where it stopped: the run in RUN_DIR, else in --out; "
                             "its config's relative paths still mean what they meant where the run started")
    parser.add_argument("--max-steps", type=COUNT, default=None,
                        help="stop (saving last.pt) once the run reaches this many optimizer steps")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: [run].device (auto)")
    parser.add_argument("--visual-weights", dest="visual_weights", default=None,
                        help="local weights of the [model].visual front end (open_clip or torchvision state dict)")
    parser.add_argument("--init-from", dest="init_from", default=None, metavar="CHECKPOINT",
                        help="start a new run from this checkpoint's weights and vocabulary (e.g. SCST only: "
                             "--set schedule.epochs=0 --set scst.epochs=20); the same as --set run.init_from=...")
    parser.add_argument("--test", action="store_true",
                        help="once the run is done, caption the test split with best.pt and [run].val_beam: "
                             "CIDEr-D in metrics.jsonl and summary.json, captions in RUN_DIR/test_captions.json")
    parser.add_argument("--quiet", action="store_true", help="no progress bar (there is none when stderr is not a terminal)")


def run(args: argparse.Namespace) -> int:
    from edgecap.train.loop import Trainer
    from edgecap.train.overrides import load_config

    out, config = run_dir_and_config(args)
    overrides = list(args.overrides)
    if args.init_from is not None:
        if args.resume is not None:
            raise EdgecapError("--init-from starts a new run; a resumed run continues from its own last save")
        overrides.append(f"run.init_from={args.init_from}")
    cfg = load_config(config, overrides, args.data)
    _check_vocabulary_overrides(cfg, args.overrides)
    if args.visual_weights is not None:
        cfg = cfg.with_visual_weights(args.visual_weights)
    trainer = Trainer(cfg, out=out, resume=args.resume is not None, max_steps=args.max_steps,
                      device=args.device, progress=not args.quiet, test=args.test)
    summary = trainer.run()
    if trainer.is_main:
        for line in report(summary):
            print(line)
    return 0


def _check_vocabulary_overrides(cfg, overrides: list[str]) -> None:
    """A run started --init-from a checkpoint keeps that checkpoint's words (its weights were
    trained on them), so an explicit `--set data.min_count=N` could only be ignored: refused."""
    if not cfg.run.init_from:
        return
    for assignment in overrides:
        if assignment.split("=", 1)[0].strip() == "data.min_count":
            raise EdgecapError(f"--set {assignment}: a run started from --init-from {cfg.run.init_from} keeps that "
                               "checkpoint's vocabulary (its weights were trained on those words), so min_count "
                               "cannot change it; leave --set data.min_count out, or train from scratch without "
                               "--init-from")


def run_dir_and_config(args: argparse.Namespace) -> tuple[str | None, str]:
    """(--out, --config) after `--resume RUN_DIR`, which names the run directory and, unless
    --config is given, the config the run keeps in it."""
    if not args.resume:  # not resuming, or --resume naming no directory: --out / [run].out
        if args.config is None:
            raise EdgecapError("--config is required (or --resume RUN_DIR to continue a run with its own config.toml)")
        return args.out, args.config
    if args.out is not None and Path(args.out).resolve() != Path(args.resume).resolve():
        raise EdgecapError(f"--resume {args.resume} and --out {args.out} name two run directories; pass one")
    return args.resume, args.config if args.config is not None else str(Path(args.resume) / "config.toml")


def _next_step(ckpt: dict) -> str:
    """The export that gives a bundle `edgecap run` can use: a captioner trained on cached
    features needs the front end that made them (docs/frontends.md) and images for the parity
    gate; one trained on features edgecap did not make exports as a features bundle."""
    path = shlex.quote(str(ckpt["path"]))
    if ckpt.get("takes_images", True):
        return f"next: edgecap export {path} --target cpu-ort-fp32   (or edgecap caption {path} IMAGE)"
    made = ckpt.get("features_provenance") or {}
    if not made.get("backbone"):
        return (f"next: edgecap export {path} --target cpu-ort-fp32   (a features bundle: its input is "
                "features like the ones it trained on, not camera frames)")
    weights = "" if made.get("weights_sha256") == "random" else " --visual-weights WEIGHTS"
    return (f"next: edgecap export {path} --target cpu-ort-fp32 --frontend {shlex.quote(made['backbone'])}"
            f"{weights}   (the front end that made its features; the parity gate reads the images beside the "
            f"training data's dataset_coco.json, or add --data DIR: a folder with dataset_coco.json and its images)")


def report(summary: dict) -> list[str]:
    """The end-of-run lines: how it ended, and which checkpoint to use next."""
    best = summary["best_val_cider_d"]
    state = "stopped" if summary["stopped"] else "finished"
    lines = [f"{state} at step {summary['step']} ({summary['phase']}); best validation CIDEr-D "
             f"{'n/a' if best is None else f'{best:.3f}'}; run directory {summary['out']}"]
    ckpt = summary.get("best_checkpoint")
    if ckpt:
        how = ("validated when --max-steps stopped the run, before any epoch ended; the next epoch end "
               "replaces it" if ckpt["validated_at_stop"] else "the best validation so far")
        lines.append(f"checkpoint: {ckpt['path']} (step {ckpt['step']}, {ckpt['phase']}, validation CIDEr-D "
                     f"{ckpt['val_cider_d']:.3f}; {how})")
        lines.append(_next_step(ckpt))
        if not ckpt.get("takes_images", True) and summary.get("test_cider_d") is None:
            path = shlex.quote(str(ckpt["path"]))
            test = shlex.quote(str(Path(summary["out"]) / "test.json"))
            lines.append(f"evaluate: edgecap caption {path} --split test --json {test}   (its features of the "
                         f"test split, in PyTorch; then edgecap eval coco)")
    if summary.get("averaged_val_cider_d") is not None:
        averaged = shlex.quote(str(Path(summary["out"]) / "averaged.pt"))
        lines.append(f"averaged: {averaged} (the mean of the last epochs' weights), validation CIDEr-D "
                     f"{summary['averaged_val_cider_d']:.3f}; best.pt stays the checkpoint above")
    if summary.get("test_cider_d") is not None:
        captions = shlex.quote(str(Path(summary["out"]) / "test_captions.json"))
        lines.append(f"test split: CIDEr-D {summary['test_cider_d']:.3f} (best.pt, the validation beam); "
                     f"captions in {captions}; next: edgecap eval coco --captions {captions} "
                     f"--refs {shlex.quote(summary['karpathy'])} --split test")
    if summary["stopped"]:
        lines.append(f"continue with the same command and --resume, or: edgecap train --resume {shlex.quote(str(summary['out']))}")
    return lines
