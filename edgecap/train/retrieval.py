"""RA-Transformer in the training loop: the retrieval index of a run and the memory it serves.

    visual front end   copied from [retrieval].visual_from (e.g. a smart checkpoint trained
                       with XE on the same world), or the run's own seeded initialisation;
                       frozen for the whole run (weights and BatchNorm statistics)
    index              [retrieval].index, or built into <run dir>/index on first start and
                       reused on resume; its embeddings are the mean of the frozen front end's
                       grid features (or of the HDF5 features), so the model's
                       `retrieval.index` (what `edgecap export` copies into the bundle) holds
                       the neighbours the robot will find
    training memory    the neighbours stored at build time (never the image itself, so never
                       its own captions), a random caption of each, picked from the dataset's
                       (seed, epoch, index) stream: a resumed run picks the same ones
    validation memory  searched from the validation image's features, first caption of each
                       neighbour: exactly what the bundle's retriever does
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from edgecap.errors import EdgecapError
from edgecap.models.checkpoint import check_weights, read_payload
from edgecap.retrieval import RetrievalMemory, image_embeddings
from edgecap.retrieval.command import feature_embeddings, model_embeddings, visual_fingerprint
from edgecap.retrieval.index import FILES, CaptionIndex


def load_visual(model, checkpoint: str | Path) -> None:
    """Copy the visual front end of `checkpoint` into `model` (shapes must match)."""
    payload = read_payload(checkpoint)
    theirs = {k[len("visual."):]: v for k, v in payload["state_dict"].items() if k.startswith("visual.")}
    mine = model.visual.state_dict()
    if not theirs:
        raise EdgecapError(f"[retrieval].visual_from {checkpoint}: the checkpoint has no visual front end weights")
    check_weights(mine, theirs, f"[retrieval].visual_from {checkpoint}",
                  f"its front end differs from [model].visual ({payload.get('config', {}).get('visual')})",
                  prefix="visual.")
    model.visual.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in theirs.items()})


def freeze_visual(model) -> None:
    for p in model.visual.parameters():
        p.requires_grad_(False)
    model.visual.eval()


def _check_index(index, path: Path, model, fingerprint: str | None, n_train: int | None) -> None:
    made = index.meta.get("embedding", {})
    if fingerprint is not None and made.get("visual_sha256") != fingerprint:
        raise EdgecapError(
            f"retrieval index {path} was built with a different visual front end than this run's "
            f"(visual_sha256 differs); delete it or point [retrieval].index elsewhere"
        )
    if index.neighbours.shape[1] < model.cfg.retrieval.k:
        raise EdgecapError(
            f"retrieval index {path} stores {index.neighbours.shape[1]} neighbours per image, the model "
            f"needs retrieval.k={model.cfg.retrieval.k}"
        )
    if n_train is not None and len(index) != n_train:
        raise EdgecapError(f"retrieval index {path} holds {len(index)} images, the training split {n_train}")


def build_index(model, train_items, out: Path, images: Path | None, features: Path | None,
                kind: str, batch_size: int, info: dict, progress: bool):
    """Embed the training images (frozen front end, or HDF5 features) and save the index at `out`."""
    start = time.perf_counter()
    if features is not None:
        emb, made = feature_embeddings(str(features), train_items, progress=progress)
    else:
        emb = model_embeddings(model, str(images), train_items, batch_size, progress=progress)
        made = {"source": "checkpoint", "visual": model.cfg.visual.kind, "visual_sha256": visual_fingerprint(model)}
    seconds = time.perf_counter() - start
    index = CaptionIndex.build(emb, [i.image_id for i in train_items], [i.caption_strings() for i in train_items],
                               kind=kind, k=model.cfg.retrieval.k,
                               embedding_info={**made, **info, "splits": ["train"]})
    index.meta["embed_seconds"] = round(seconds, 3)
    index.save(out, force=True)
    return index


def prepare_index(model, r, seed: int, train_items, out: Path, images: Path | None, features: Path | None,
                  is_main: bool, barrier, progress: bool) -> Path:
    """Reuse [retrieval].index (`r`, the run's section) or <run dir>/index (checked against the
    frozen front end), or build the latter on rank 0; -> the index directory (absolute)."""
    fingerprint = visual_fingerprint(model) if images is not None else None
    if r.index:
        path = Path(r.index).resolve()
        _check_index(CaptionIndex.load(path), path, model, fingerprint, None)
        return path
    path = (out / "index").resolve()
    if is_main and not all((path / name).is_file() for name in FILES):
        source = r.visual_from or f"initial weights of the run (seed {seed})"
        build_index(model, train_items, path, images, features, r.kind, r.batch_size,
                    {"file": Path(source).name if r.visual_from else source}, progress)
    barrier()
    _check_index(CaptionIndex.load(path), path, model, fingerprint, len(train_items))
    return path


class TrainingRetrieval:
    """Memory tokens for training items (stored neighbours) and for validation features (search)."""

    def __init__(self, path: Path, vocab, model_cfg):
        self.path = path
        self.memory = RetrievalMemory.for_model(CaptionIndex.load(path), vocab.stoi, model_cfg)

    def __call__(self, item, rng: np.random.Generator) -> tuple[torch.Tensor]:
        """CaptionDataset's `extra`: one training image -> (memory_tokens [k, length],)."""
        return (torch.from_numpy(self.memory.for_indexed([item.image_id], rng)[0]),)

    def for_features(self, feats: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor]:
        """Images outside the index (validation): search with their features, like the bundle."""
        emb = image_embeddings(feats.detach().float().cpu().numpy(), mask.detach().cpu().numpy())
        return (torch.from_numpy(self.memory.for_embeddings(emb)).to(feats.device),)
