"""`edgecap demo`: export the packaged demo model once, then caption the synthetic world live.

    edgecap demo                       # demo-out/captions.jsonl, demo-out/demo.mp4
    edgecap demo --frames 120 --beam 1
    edgecap demo --checkpoint runs/smart/best.pt --out my-demo

The first run exports the checkpoint to `OUT/bundle` (PyTorch + ONNX, the `train` extra);
later runs reuse it until the checkpoint's sha256 or the export settings change
(`OUT/bundle.source.json` records both). Captioning itself is the torch-free `edgecap run` loop
on `synth://tabletop`, with coverage against the world's exact objects. Works offline.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

from edgecap.argtypes import BEAM, COUNT, IMAGE_SIDE, POSITIVE, SEED
from edgecap.errors import EdgecapError, require
from edgecap.export.formats import resolve_settings
from edgecap.io import check_file_target, json_file_with, sha256_file, write_json_atomic
from edgecap.jsonio import json_or_none
from edgecap.png import check_target, save_image

DEMO_ASSET = "demo-smart.pt"
STAMP = "bundle.source.json"
FRAMES = "frames.png"
WORLD = "synth://tabletop?seed={seed}&size={size}&fps=15&scene={scene:g}"


def add_arguments(parser) -> None:
    parser.add_argument("--checkpoint", default=None,
                        help=f"checkpoint to demo (default: the packaged edgecap/assets/{DEMO_ASSET})")
    parser.add_argument("--frames", type=COUNT, default=60, help="captions to produce (default 60)")
    parser.add_argument("--out", default="demo-out", help="output folder (default demo-out)")
    parser.add_argument("--beam", type=BEAM, default=3, help="beam size (default 3)")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of the synthetic world (default 0)")
    parser.add_argument("--size", type=IMAGE_SIDE, default=None,
                        help="rendered frame size (default: the model's input size, which is the "
                             "size the demo model's training world was rendered at)")
    parser.add_argument("--scene", type=POSITIVE, default=2.0,
                        help="seconds before the world moves to a new table (default 2)")
    parser.add_argument("--max-fps", type=POSITIVE, default=5.0,
                        help="captions per second at most (default 5, so the demo spans scenes)")
    parser.add_argument("--reexport", action="store_true", help="export again even if cached")


def demo_checkpoint() -> Path:
    return Path(str(resources.files("edgecap") / "assets" / DEMO_ASSET))


def _stamp(checkpoint: Path, beam: int) -> dict:
    from edgecap.contract.manifest import FORMAT_VERSION

    # the bundle format too: a bundle cached by an older edgecap is exported again, not refused
    return {"checkpoint": str(checkpoint), "sha256": sha256_file(checkpoint),
            "export": {"engine": "onnx", "precision": "fp32", "batch": 1, "beam": beam},
            "bundle_format": FORMAT_VERSION}


def ensure_bundle(checkpoint: Path, out: Path, beam: int, reexport: bool = False, log=print) -> Path:
    """OUT/bundle exported from `checkpoint`, re-exported only when the stamp differs."""
    bundle, stamp_path = out / "bundle", out / STAMP
    stamp = _stamp(checkpoint, beam)
    if not reexport and bundle.is_dir() and stamp_path.is_file():
        old = json_or_none(stamp_path)  # a stamp that is not ours (or is damaged) means: export again
        if isinstance(old, dict) and all(old.get(k) == stamp[k] for k in ("sha256", "export", "bundle_format")):
            return bundle
    require("torch", "train", "edgecap demo exports the demo checkpoint with PyTorch")
    from edgecap.export.bundle import export_bundle

    log(f"exporting {checkpoint} -> {bundle} (once per checkpoint; cached in {stamp_path.name})")
    settings = dict(stamp["export"], out=str(bundle), force=True)
    export_bundle(str(checkpoint), resolve_settings(settings))
    write_json_atomic(stamp_path, stamp)
    return bundle


class Stills:
    """Two annotated frames of the run, a quarter and three quarters in, side by side in one
    PNG (the README's picture comes from here)."""

    def __init__(self, frames: int):
        self.picks = sorted({frames // 4, (3 * frames) // 4})
        self.seen = 0
        self.images = []

    def keep(self, record) -> None:
        from edgecap.runtime.overlay import annotate

        if self.seen in self.picks:
            self.images.append(annotate(record))
        self.seen += 1

    def write(self, path: Path) -> Path | None:
        import cv2
        import numpy as np

        if not self.images:
            return None
        height = max(im.shape[0] for im in self.images)
        row = np.hstack([cv2.copyMakeBorder(im, 0, height - im.shape[0], 0, 0, cv2.BORDER_CONSTANT, value=0)
                         for im in self.images])
        return save_image(row, path, checked=True)  # by check_outputs


def check_outputs(out: Path) -> None:
    """Before the export: OUT's files that the demo rewrites are the demo's own. Its stamp must
    be one; frames.png is the demo's when marked as edgecap's, or when OUT holds the demo's
    stamp (an OUT the demo wrote before PNGs were marked)."""
    stamp = out / STAMP
    is_stamp = json_file_with("checkpoint", "sha256", "export")
    check_file_target(stamp, is_stamp, "the demo's export stamp")
    if not (stamp.is_file() and is_stamp(stamp)):
        check_target(out / FRAMES)


def run(args) -> int:
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.command import RunSettings, execute

    checkpoint = Path(args.checkpoint) if args.checkpoint else demo_checkpoint()
    if not checkpoint.is_file():
        if args.checkpoint:
            raise EdgecapError(f"--checkpoint {checkpoint} does not exist")
        raise EdgecapError(f"the packaged demo model {checkpoint} is missing (an incomplete "
                           "install?); reinstall edgecap or pass --checkpoint FILE")
    out = Path(args.out)
    check_outputs(out)
    bundle = ensure_bundle(checkpoint, out, args.beam, args.reexport)
    captioner = Captioner.from_bundle(bundle, beam=args.beam)
    world = WORLD.format(seed=args.seed, size=args.size or max(32, captioner.size), scene=args.scene)
    print(f"captioning {args.frames} frames of {world} with {bundle} "
          f"(beam {captioner.beam}, {captioner.size}px input)", flush=True)
    settings = RunSettings(source=world, frames=args.frames, max_fps=args.max_fps,
                           jsonl=str(out / "captions.jsonl"), save_video=str(out / "demo.mp4"))
    stills = Stills(args.frames)
    summary, error = execute(captioner, settings, sinks=[stills.keep])
    if error:
        raise EdgecapError(error)
    written = stills.write(out / FRAMES)
    print(f"\nwrote {out / 'captions.jsonl'} ({summary.captioned} records), "
          f"{out / 'captions.summary.json'}, {out / 'demo.mp4'} (annotated video)"
          + (f" and {written} (two annotated frames)" if written else ""))
    sys.stdout.flush()
    return 0
