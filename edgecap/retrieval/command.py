"""`edgecap index build`: the RA-Transformer retrieval index over a Karpathy split.

    edgecap index build --features coco_vitl14.h5 --split-file dataset_coco.json --out coco_index
    edgecap index build --checkpoint run/best.pt --images synth/images \\
        --split-file synth/dataset_coco.json --out synth_index

Embeddings are the mean of each image's grid features: read from HDF5 (`<id>_features`), or
computed with the checkpoint's own visual front end on the images (its weights' fingerprint
is recorded, so a model whose front end differs from the one that built the index is refused
at export). The training split (restval folded in) is indexed by default.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from edgecap.argtypes import BATCH, Integer
from edgecap.data.karpathy import load_karpathy
from edgecap.errors import EdgecapError
from edgecap.io import RETRIEVAL_INDEX, check_replaceable, probe_writable
from edgecap.progress import progress_bar

NEIGHBOURS = Integer(1, 1000)  # stored per indexed image (RA-Transformer retrieves k = 5..10)


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("build", help="embed the training images, build the FAISS index, save it with the captions")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--features", help="HDF5 features (<image_id>_features)")
    src.add_argument("--checkpoint", help="an edgecap checkpoint whose visual front end embeds --images")
    p.add_argument("--images", help="image root for --checkpoint: files are IMAGES/<filepath>/<filename>")
    p.add_argument("--split-file", required=True, help="Karpathy dataset_coco.json")
    p.add_argument("--splits", default="train", help="comma-separated splits to index (default train, which includes restval)")
    p.add_argument("--out", required=True, help="index directory to write")
    p.add_argument("--kind", default="auto", choices=("auto", "flat", "hnsw"),
                   help="flat (exact) or hnsw (HNSW-32); default auto: flat below 5,000 images, HNSW-32 above")
    p.add_argument("-k", "--k", type=NEIGHBOURS, default=10, help="neighbours stored per indexed image (default 10)")
    p.add_argument("--batch-size", type=BATCH, default=32, help="--checkpoint: images per forward pass (default 32)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar (there is none when stderr is not a terminal)")


def feature_embeddings(path: str, items, progress: bool = True) -> tuple:
    from edgecap.data.features import FeatureStore
    from edgecap.retrieval.embedding import image_embeddings

    store = FeatureStore(path)
    out = []
    with store, progress_bar(total=len(items), quiet=not progress, desc="embed", unit="img", leave=False) as bar:
        for item in items:
            out.append(image_embeddings(store.raw(item.image_id)[None])[0])
            if out[-1].shape != out[0].shape:  # one index holds one width: name the two that differ
                raise EdgecapError(f"features {path}: image {item.image_id} has features {out[-1].shape[0]} wide, "
                                   f"image {items[0].image_id} {out[0].shape[0]} wide; an index is built over the "
                                   "features of one extractor")
            bar.update(1)
        info = {"source": "features", "file": Path(path).name, "attrs": store.attrs}
    return np.stack(out), info


def visual_fingerprint(model) -> str:
    """sha256 over the visual front end's weights: which backbone made the embeddings."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.visual.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def model_embeddings(model, root: str, items, batch_size: int, progress: bool = True):
    """Embed the images of `items` (under `root`) with `model`'s visual front end in eval mode
    (BatchNorm statistics as stored) -> float32 [n, D] unit vectors."""
    import cv2
    import torch

    from edgecap.contract.preprocess import preprocess_as
    from edgecap.retrieval.embedding import image_embeddings

    vc = model.cfg.visual
    was_training = model.visual.training
    model.visual.eval()
    out = []
    try:
        with progress_bar(total=len(items), quiet=not progress, desc="embed", unit="img", leave=False) as bar:
            for start in range(0, len(items), batch_size):
                chunk = items[start : start + batch_size]
                images = []
                for item in chunk:
                    path = Path(root) / item.path
                    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
                    if bgr is None:
                        raise EdgecapError(f"image {item.image_id}: cannot read {path}")
                    images.append(preprocess_as(bgr, vc.preprocessing()))
                device = next(iter(model.parameters())).device
                with torch.no_grad():
                    feats, mask = model.visual(torch.from_numpy(np.stack(images)).to(device))
                out.append(image_embeddings(feats.cpu().numpy(), mask.cpu().numpy()))
                bar.update(len(chunk))
    finally:
        model.visual.train(was_training)
    return np.concatenate(out)


def checkpoint_embeddings(checkpoint: str, root: str, items, batch_size: int, progress: bool = True) -> tuple:
    from edgecap.models.checkpoint import load_checkpoint

    ckpt = load_checkpoint(checkpoint)
    model, vc = ckpt.model, ckpt.config.visual
    if not getattr(model.visual, "takes_images", False):
        raise EdgecapError(
            f"checkpoint {checkpoint} reads precomputed features (visual.kind={vc.kind!r}); use --features"
        )
    emb = model_embeddings(model, root, items, batch_size, progress)
    info = {"source": "checkpoint", "file": Path(checkpoint).name, "visual": vc.kind,
            "visual_sha256": visual_fingerprint(model)}
    return emb, info


def run(args) -> int:
    from edgecap.retrieval.index import CaptionIndex

    check_replaceable(args.out, RETRIEVAL_INDEX, args.force)  # before the slow part
    probe_writable(args.out)

    if args.checkpoint and not args.images:
        raise EdgecapError("--checkpoint needs --images (the image root of the split file)")
    if args.images and not args.checkpoint:
        raise EdgecapError("--images is the image root a --checkpoint embeds; --features already holds the embeddings")
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    data = load_karpathy(args.split_file, image_root=args.images if args.checkpoint else None)
    items = [item for s in splits for item in data[s]]
    if not items:
        raise EdgecapError(f"split file {args.split_file} has no images in splits {splits}")
    start = time.perf_counter()
    if args.features:
        emb, info = feature_embeddings(args.features, items, progress=not args.quiet)
    else:
        emb, info = checkpoint_embeddings(args.checkpoint, args.images, items, args.batch_size, not args.quiet)
    embed_seconds = time.perf_counter() - start
    index = CaptionIndex.build(emb, [i.image_id for i in items], [i.caption_strings() for i in items],
                               kind=args.kind, k=args.k, embedding_info={**info, "splits": splits})
    index.meta["embed_seconds"] = round(embed_seconds, 3)
    out = index.save(args.out, force=args.force)
    size = sum(f.stat().st_size for f in Path(out).iterdir())
    m = index.meta
    kind = f"{m['kind']}-{m['links']}" if m["links"] else m["kind"]
    print(f"indexed {m['count']} images ({m['dim']}-d, {kind}, inner product): build "
          f"{m['build_seconds'] * 1e3:.1f} ms, {m['k']} neighbours each {m['neighbour_seconds'] * 1e3:.1f} ms, "
          f"embedding {embed_seconds:.1f} s; index size {size / 1e6:.2f} MB in {out}")
    return 0
