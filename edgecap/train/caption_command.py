"""`edgecap caption CHECKPOINT IMAGE|FOLDER... [--json OUT]`: captions decoded in PyTorch.

    edgecap caption runs/demo/best.pt photo.jpg
    edgecap caption runs/demo/best.pt data/coco/val2014 --json val_captions.json --beam 3
    edgecap eval coco --captions val_captions.json --refs dataset_coco.json --split val

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
from edgecap.progress import progress_bar

COCO_NAME = re.compile(r"(?:COCO_[A-Za-z]+\d*_)?0*(\d+)")


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", help="an edgecap checkpoint (.pt); for an exported bundle use edgecap run")
    parser.add_argument("images", nargs="+", metavar="IMAGE|FOLDER",
                        help="image files (anything OpenCV reads) or folders of them")
    parser.add_argument("--json", metavar="OUT", default=None,
                        help="write the captions as COCO results JSON [{image_id, caption}] "
                             "(what edgecap eval coco --captions reads)")
    parser.add_argument("--beam", type=BEAM, default=3, help="beam size (1 = greedy; default 3)")
    parser.add_argument("--batch", type=BATCH, default=16, help="images per forward pass (default 16)")
    parser.add_argument("--max-len", type=Integer(2), default=None,
                        help="longest caption in tokens, 2..the checkpoint's (default: the checkpoint's)")
    parser.add_argument("--length-penalty", type=Number(0), default=0.0,
                        help="alpha of the GNMT length normalisation in beam search, >= 0 (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no line per image")


def image_paths(inputs: list[str]) -> list[Path]:
    """The files named, with each folder replaced by its images in name order."""
    from edgecap.errors import EdgecapError
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
    from edgecap.io import check_file_target

    check_file_target(path, _is_captions_json, "a captions JSON", "--json")


def _is_captions_json(path: Path) -> bool:
    from edgecap.jsonio import json_or_none

    data = json_or_none(path)
    return isinstance(data, list) and all(isinstance(r, dict) and "caption" in r for r in data)


def check_checkpoint_path(path: Path) -> None:
    """A bundle or a folder given where a checkpoint belongs gets told what to do instead."""
    from edgecap.errors import EdgecapError
    from edgecap.io import BUNDLE

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
    from edgecap.errors import EdgecapError
    from edgecap.io import write_json_atomic
    from edgecap.models.checkpoint import load_checkpoint
    from edgecap.runtime.sources import BadFrame, read_image
    from edgecap.train.captioning import caption_batch, retrieval_for

    check_checkpoint_path(Path(args.checkpoint))
    out = Path(args.json) if args.json else None
    if out is not None:
        check_output(out)
    paths = image_paths(args.images)
    ckpt = load_checkpoint(args.checkpoint)
    model, vc = ckpt.model, ckpt.config.visual
    if not getattr(model.visual, "takes_images", False):
        raise EdgecapError(
            f"checkpoint {args.checkpoint} reads precomputed features (visual.kind={vc.kind!r}), not images"
        )
    max_len = ckpt.config.max_len if args.max_len is None else args.max_len
    if not 2 <= max_len <= ckpt.config.max_len:
        raise EdgecapError(f"--max-len {max_len}: expected 2..{ckpt.config.max_len} (the model's caption length)")
    if args.beam > ckpt.config.vocab_size:
        raise EdgecapError(f"--beam {args.beam}: expected 1..{ckpt.config.vocab_size} (the model's vocabulary)")
    options = DecodeOptions(beam_size=args.beam, max_len=max_len, length_penalty=args.length_penalty)
    retrieval = retrieval_for(ckpt)
    bar = progress_bar(total=len(paths), quiet=args.quiet, desc="caption", unit="img")
    results = []
    with bar:
        for start in range(0, len(paths), args.batch):
            chunk = paths[start:start + args.batch]
            arrays = []
            for path in chunk:
                try:
                    image = read_image(path)
                except BadFrame as exc:  # a damaged file is no caption: stop before writing any
                    raise EdgecapError(f"cannot read image {exc}"
                                       + (f"; nothing written to {out}" if out else "")) from None
                arrays.append(preprocess_as(image, vc.preprocessing()))
            captions = caption_batch(ckpt, torch.from_numpy(np.stack(arrays)), options, retrieval)
            for path, caption in zip(chunk, captions, strict=True):
                results.append((path, caption))
                if not args.quiet:
                    bar.write(f"{path}\t{caption}", file=sys.stdout)
            bar.update(len(chunk))
    if out is not None:
        records = [{"image_id": i, "caption": c} for i, (_, c) in zip(image_ids(paths), results, strict=True)]
        write_json_atomic(out, records)
        print(f"wrote {out} ({len(records)} captions, COCO results format: "
              f"edgecap eval coco --captions {shlex.quote(str(out))} --refs dataset_coco.json)")
    return 0
