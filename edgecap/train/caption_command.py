"""`edgecap caption CHECKPOINT IMAGE|FOLDER... [--json OUT]`: captions decoded in PyTorch.

    edgecap caption runs/demo/best.pt photo.jpg
    edgecap caption runs/demo/best.pt data/coco/val2014 --json val_captions.json --beam 3
    edgecap eval coco --captions val_captions.json --refs dataset_coco.json --split val
    edgecap caption runs/m2/best.pt --features coco_detections.hdf5 --split test --json test.json

`--split test|val` captions a Karpathy split of the checkpoint's training data (or
`--karpathy FILE`): from the HDF5 features a features-trained checkpoint reads (`--features`,
default the training features), or from the training images. The ids are the split's cocoids.

A folder stands for the images in it (not its subfolders), in name order. `--json` writes the
COCO results format `edgecap eval coco` and the COCO server read: a list of
{"image_id", "caption"}, the image id being the number in a COCO file name
(COCO_val2014_000000391895.jpg -> 391895) or an all-digit file stem, otherwise the file name.
Images go through the model in batches, with a progress bar on stderr.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from edgecap.argtypes import BATCH, BEAM, Integer, Number
from edgecap.data.karpathy import load_karpathy
from edgecap.errors import EdgecapError
from edgecap.io import BUNDLE, check_file_target, write_json_atomic
from edgecap.jsonio import json_or_none
from edgecap.progress import progress_bar

COCO_NAME = re.compile(r"(?:COCO_[A-Za-z]+\d*_)?0*(\d+)")


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", help="an edgecap checkpoint (.pt); for an exported bundle use edgecap run")
    parser.add_argument("images", nargs="*", metavar="IMAGE|FOLDER",
                        help="image files (anything OpenCV reads) or folders of them (not with --split)")
    parser.add_argument("--split", choices=("test", "val"), default=None,
                        help="caption this Karpathy split of the training data instead of images: from "
                             "--features for a checkpoint trained on features, else the training images")
    parser.add_argument("--features", metavar="FILE", default=None,
                        help="with --split: HDF5 features in M2's layout (<image_id>_features), as the "
                             "checkpoint trained on (default: its training features file)")
    parser.add_argument("--karpathy", metavar="FILE", default=None,
                        help="with --split: the Karpathy dataset_coco.json (default: the checkpoint's training data)")
    parser.add_argument("--json", metavar="OUT", default=None,
                        help="write the captions as COCO results JSON [{image_id, caption}] "
                             "(what edgecap eval coco --captions reads)")
    parser.add_argument("--beam", type=BEAM, default=3, help="beam size (1 = greedy; default 3)")
    parser.add_argument("--batch", type=BATCH, default=16, help="images per forward pass (default 16)")
    parser.add_argument("--max-len", type=Integer(2), default=None,
                        help="longest caption in tokens, 2..the checkpoint's (default: the checkpoint's)")
    parser.add_argument("--length-penalty", type=Number(0), default=0.0,
                        help="alpha of the GNMT length normalisation in beam search, >= 0 (default 0)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the model runs (default cpu; a COCO split at beam 5 wants cuda)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no line per image")


def image_paths(inputs: list[str]) -> list[Path]:
    """The files named, with each folder replaced by its images in name order."""
    from edgecap.runtime.sources import folder_images, no_images_reason

    paths: list[Path] = []
    for text in inputs:
        path = Path(text)
        if path.is_dir():
            found = folder_images(path)
            if not found:
                raise EdgecapError(f"{path}: {no_images_reason(path)}")
            paths += found
        elif path.is_file():
            paths.append(path)
        else:
            raise EdgecapError(f"{path}: no such image file or folder")
    return paths


def image_ids(paths: list[Path]) -> list[int | str]:
    """COCO ids from COCO-style or numeric names, else the file name (the path when two clash)."""
    ids: list[int | str] = []
    for path in paths:
        match = COCO_NAME.fullmatch(path.stem)
        ids.append(int(match.group(1)) if match else path.name)
    seen: dict = {}
    for i in ids:
        seen[i] = seen.get(i, 0) + 1
    return [str(p) if seen[i] > 1 else i for p, i in zip(paths, ids, strict=True)]


def check_output(path: Path) -> None:
    """Refuse to overwrite a file that is not a captions JSON (one we could have written)."""
    check_file_target(path, _is_captions_json, "a captions JSON", "--json")


def _is_captions_json(path: Path) -> bool:
    data = json_or_none(path)
    return isinstance(data, list) and all(isinstance(r, dict) and "caption" in r for r in data)


def check_checkpoint_path(path: Path) -> None:
    """A bundle or a folder given where a checkpoint belongs gets told what to do instead."""
    if BUNDLE.owns(path):
        raise EdgecapError(f"{path} is an exported bundle, not a checkpoint: caption with the robot runtime, "
                           f"edgecap run {shlex.quote(str(path))} --source IMAGE_OR_FOLDER")
    if path.is_dir():
        raise EdgecapError(f"{path} is a directory, not a checkpoint (.pt)")


def run(args) -> int:
    import numpy as np
    import torch

    from edgecap.contract.beam import DecodeOptions
    from edgecap.contract.preprocess import preprocess_as
    from edgecap.models.checkpoint import load_checkpoint
    from edgecap.runtime.sources import BadFrame, read_image
    from edgecap.train.captioning import caption_batch, extra_inputs_for

    check_checkpoint_path(Path(args.checkpoint))
    out = Path(args.json) if args.json else None
    if out is not None:
        check_output(out)
    if args.split is None:
        for flag in ("features", "karpathy"):
            if getattr(args, flag) is not None:
                raise EdgecapError(f"--{flag} goes with --split test|val (a split of the data to caption)")
        if not args.images:
            raise EdgecapError("name images or folders to caption, or --split test|val for a split of the training data")
    elif args.images:
        raise EdgecapError(f"--split {args.split} captions the split's images; name no images besides it")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise EdgecapError("--device cuda: no CUDA device is available")
    ckpt = load_checkpoint(args.checkpoint, args.device)
    model, vc = ckpt.model, ckpt.config.visual
    max_len = ckpt.config.max_len if args.max_len is None else args.max_len
    if not 2 <= max_len <= ckpt.config.max_len:
        raise EdgecapError(f"--max-len {max_len}: expected 2..{ckpt.config.max_len} (the model's caption length)")
    if args.beam > ckpt.config.vocab_size:
        raise EdgecapError(f"--beam {args.beam}: expected 1..{ckpt.config.vocab_size} (the model's vocabulary)")
    options = DecodeOptions(beam_size=args.beam, max_len=max_len, length_penalty=args.length_penalty)
    extra_inputs = extra_inputs_for(ckpt)
    if args.split is not None:
        return caption_split(args, ckpt, options, extra_inputs, out)
    if not getattr(model.visual, "takes_images", False):
        ck = shlex.quote(str(args.checkpoint))
        raise EdgecapError(
            f"checkpoint {args.checkpoint} reads precomputed features (visual.kind={vc.kind!r}), not images; "
            f"caption a split from its features: edgecap caption {ck} --features FILE.h5 --split test --json OUT"
        )
    paths = image_paths(args.images)
    bar = progress_bar(total=len(paths), quiet=args.quiet, desc="caption", unit="img")
    results, skipped = [], []
    with bar:
        for start in range(0, len(paths), args.batch):
            chunk, arrays = [], []
            for path in paths[start:start + args.batch]:
                try:
                    image = read_image(path)
                except BadFrame as exc:  # empty, damaged, undecodable: named and counted, as edgecap run does
                    skipped.append(str(exc))
                    if len(paths) > 1:  # one image alone: the error below names it
                        bar.write(f"edgecap caption: skipped: {exc}", file=sys.stderr)
                    continue
                chunk.append(path)
                arrays.append(preprocess_as(image, vc.preprocessing()))
            captions = caption_batch(ckpt, torch.from_numpy(np.stack(arrays)).to(args.device), options,
                                     extra_inputs) if arrays else []
            for path, caption in zip(chunk, captions, strict=True):
                results.append((path, caption))
                if not args.quiet:
                    bar.write(f"{path}\t{caption}", file=sys.stdout)
            bar.update(len(paths[start:start + args.batch]))
    if not results:
        what = f"cannot read image {skipped[0]}" if len(skipped) == 1 else \
            f"none of the {len(skipped)} images could be read (each named above)"
        raise EdgecapError(what + (f"; nothing written to {out}" if out else ""))
    if skipped:
        print(f"edgecap caption: {len(skipped)} of {_count(len(paths), 'image')} skipped (empty, damaged or "
              f"undecodable: named above); {len(results)} captioned", file=sys.stderr)
    if out is not None:
        kept = [path for path, _ in results]
        records = [{"image_id": i, "caption": c} for i, (_, c) in zip(image_ids(kept), results, strict=True)]
        write_json_atomic(out, records)
        also = f", {_count(len(skipped), 'image')} skipped" if skipped else ""
        print(f"wrote {out} ({len(records)} captions{also}, "
              f"COCO results format: edgecap eval coco --captions {shlex.quote(str(out))} --refs dataset_coco.json)")
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def split_data(args, ckpt) -> tuple[Path, Path | None, Path | None]:
    """(Karpathy json, image root, features file) for --split: --karpathy / --features, else the
    data the checkpoint trained on, found as export finds it."""
    from edgecap.export.verify import find_parity_data

    found, _, looked = find_parity_data("", ckpt.meta, Path(args.checkpoint))
    karpathy = Path(args.karpathy) if args.karpathy else found.karpathy if found else None
    if karpathy is None:
        where = f" (looked at {', '.join(looked)})" if looked else ""
        raise EdgecapError(f"--split {args.split}: the checkpoint's training data is not found{where}; "
                           f"pass --karpathy dataset_coco.json")
    features = Path(args.features) if args.features else found.features if found else None
    return karpathy, found.images if found else None, features


def caption_split(args, ckpt, options, extra_inputs, out: Path | None) -> int:
    """--split: every image of a Karpathy split, from features or images, into COCO results."""
    from edgecap.train.split_captions import (
        caption_images,
        ciderd,
        feature_source,
        image_source,
        results,
    )

    karpathy, images, features = split_data(args, ckpt)
    cfg = ckpt.config
    if getattr(ckpt.model.visual, "takes_images", False):
        if args.features:
            raise EdgecapError(f"--features: checkpoint {args.checkpoint} reads images, not features "
                               f"(visual.kind={cfg.visual.kind!r}); leave --features out")
        if images is None or not images.is_dir():
            raise EdgecapError(f"--split {args.split}: checkpoint {args.checkpoint} reads images and its training "
                               f"images are not found; caption the folder: edgecap caption CHECKPOINT FOLDER --json OUT")
        items = load_karpathy(karpathy, images, splits=(args.split,))[args.split]
        source = image_source(images, cfg)
    else:
        if features is None or not features.is_file():
            raise EdgecapError(f"--split {args.split}: checkpoint {args.checkpoint} reads features; pass "
                               f"--features FILE.h5 (its training features {features or '(none named)'} are not there)")
        items = load_karpathy(karpathy, None, splits=(args.split,))[args.split]
        source = feature_source(features, cfg, ckpt.meta)
        source.check(items)
    if not items:
        raise EdgecapError(f"{karpathy}: no images in split {args.split}")
    bar = progress_bar(total=len(items), quiet=args.quiet, desc=f"caption {args.split}", unit="img")

    def show(chunk, captions):
        if not args.quiet:
            for item, caption in zip(chunk, captions, strict=True):
                bar.write(f"{item.image_id}\t{caption}", file=sys.stdout)
        bar.update(len(chunk))

    with bar:
        captions = caption_images(ckpt.model, ckpt.vocab, source, items, options, args.batch, args.device, extra_inputs, show)
    print(f"{args.split} split: {len(items)} images, beam {options.beam_size}; CIDEr-D {ciderd(items, captions):.4f} "
          f"against the Karpathy tokens (the COCO evaluation's numbers: edgecap eval coco)")
    if out is not None:
        write_json_atomic(out, results(items, captions))
        print(f"wrote {out} ({len(items)} captions, COCO results format)")
        print(f"next: edgecap eval coco --captions {shlex.quote(str(out))} --refs {shlex.quote(str(karpathy))} "
              f"--split {args.split}")
    return 0
