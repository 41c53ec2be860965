"""`edgecap train --config CONFIG.toml [--data DIR] [--set KEY=VALUE ...] [--out DIR] [--resume]
[--max-steps N] [--device cpu|cuda]`.

Multi-GPU (or multi-process CPU) training is the same command under torchrun:
    torchrun --nproc_per_node=2 -m edgecap.cli train --config CONFIG.toml
"""

from __future__ import annotations

import argparse
import shlex


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="training config (TOML), e.g. configs/demo-tabletop.toml")
    parser.add_argument("--data", default=None, metavar="DIR",
                        help="train on this dataset folder instead of the config's data: dataset_coco.json "
                             "plus images/ (as edgecap data synth writes) or features.h5")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change one config value, dotted key, checked against the config's type "
                             "(e.g. --set schedule.epochs=3 --set model.memory.slots=8); repeatable")
    parser.add_argument("--out", default=None, help="run directory (default: [run].out or runs/<config name>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop (saving last.pt) once the run reaches this many optimizer steps")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: [run].device (auto)")
    parser.add_argument("--visual-weights", dest="visual_weights", default=None,
                        help="local weights of the [model].visual front end (open_clip or torchvision state dict)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from edgecap.errors import EdgecapError
    from edgecap.train.config import load_config
    from edgecap.train.loop import Trainer

    if args.max_steps is not None and args.max_steps < 1:
        raise EdgecapError(f"--max-steps {args.max_steps}: expected a positive step count")
    cfg = load_config(args.config, args.overrides, args.data)
    if args.visual_weights is not None:
        cfg = cfg.with_visual_weights(args.visual_weights)
    trainer = Trainer(cfg, out=args.out, resume=args.resume, max_steps=args.max_steps,
                      device=args.device, progress=not args.quiet)
    summary = trainer.run()
    if trainer.is_main:
        for line in report(summary):
            print(line)
    return 0


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
        path = shlex.quote(str(ckpt["path"]))
        lines.append(f"next: edgecap export {path} --target cpu-ort-fp32   (or edgecap caption {path} IMAGE)")
    if summary["stopped"]:
        lines.append("continue with the same command and --resume")
    return lines
