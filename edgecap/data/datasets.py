"""torch Datasets over Karpathy splits: images from a folder or precomputed HDF5 features.

Batches are image-major: one dataset item is one image with all its reference captions, and
`collate` flattens the captions into rows [R, L] with `owner[r]` = the image of row r. The
trainer runs the visual front end and encoder once per image and expands the cross state to
the caption rows, so an epoch still trains on every (image, caption) pair, as the M2 code does,
at a fifth of the encoder cost.

Images go through `edgecap.contract.preprocess.preprocess`, the function the exported bundle
and the runtime use, so training and the robot see identical tensors. The only augmentation
(`augment="shift"`) translates the image by a few pixels with replicated borders: it keeps
colours (captions name them), left/right (captions say "to the left of") and day/night.
Its randomness comes from (seed, epoch, index), so a resumed run draws the same shifts.

`extra(item, rng)` adds per-image extra encoder inputs (RA-Transformer's retrieved captions,
`[k, length]`); collate stacks them into `Batch.extra`. Its rng is its own stream, also from
(seed, epoch, index), so which caption of a neighbour is picked is reproduced on resume too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from edgecap.contract.preprocess import preprocess_as
from edgecap.contract.vocab import Vocab
from edgecap.data.features import FeatureStore
from edgecap.data.karpathy import KarpathyImage
from edgecap.errors import EdgecapError

AUGMENTATIONS = ("none", "shift")


class ImageSource:
    """Reads `root/<filepath>/<filename>` with OpenCV and preprocesses it as the model says."""

    takes_images = True

    def __init__(self, root: str | os.PathLike, visual, augment: str = "none", shift: int = 4,
                 cache: bool = False):
        if augment not in AUGMENTATIONS:
            raise EdgecapError(f"data.augment={augment!r}, expected one of {', '.join(AUGMENTATIONS)}")
        self.root = Path(root)
        self.visual = visual
        self.preprocessing = visual.preprocessing()
        self.augment = augment
        self.shift = int(shift)
        self.cache: dict[str, np.ndarray] | None = {} if cache else None

    def _read(self, item: KarpathyImage) -> np.ndarray:
        import cv2

        if self.cache is not None and item.image_id in self.cache:
            return self.cache[item.image_id]
        path = self.root / item.path
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise EdgecapError(f"image {item.image_id}: cannot read {path} (missing or not an image)")
        if self.cache is not None:
            self.cache[item.image_id] = image
        return image

    def load(self, item: KarpathyImage, rng: np.random.Generator | None):
        x = preprocess_as(self._read(item), self.preprocessing)
        if rng is not None and self.augment == "shift" and self.shift > 0:
            # Translate by (dx, dy) with edge pixels replicated into the uncovered border.
            s = self.shift
            dx, dy = (int(d) for d in rng.integers(-s, s + 1, size=2))
            padded = np.pad(x, ((0, 0), (s, s), (s, s)), mode="edge")
            h, w = x.shape[1:]
            x = np.ascontiguousarray(padded[:, s - dy : s - dy + h, s - dx : s - dx + w])
        return torch.from_numpy(x), None


class FeatureSource:
    """`<image_id>_features` rows from an HDF5 file, padded to the model's static n_regions."""

    takes_images = False

    def __init__(self, path: str | os.PathLike, n_regions: int, d_in: int):
        self.store = FeatureStore(path, n_regions=n_regions)
        self.d_in = d_in

    def check(self, images: list[KarpathyImage]) -> None:
        """Fail now, naming the first missing `<image_id>_features`, rather than mid-epoch."""
        have = set(self.store.ids())
        missing = [im.image_id for im in images if im.image_id not in have]
        if missing:
            raise EdgecapError(
                f"features file {self.store.path} has no key '{missing[0]}_features' "
                f"({len(missing)} of {len(images)} images missing)"
            )

    def load(self, item: KarpathyImage, rng=None):
        feats, mask = self.store.get(item.image_id)
        if feats.shape[1] != self.d_in:
            raise EdgecapError(
                f"features file {self.store.path}: {item.image_id}_features has {feats.shape[1]} "
                f"dimensions, the model expects d_in={self.d_in}"
            )
        return torch.from_numpy(feats), torch.from_numpy(mask)


class CaptionDataset(Dataset):
    """Item i: image i's visual input and all its captions encoded with the vocabulary."""

    def __init__(self, images: list[KarpathyImage], source, vocab: Vocab, max_len: int,
                 seed: int = 0, augment: bool = False, extra=None):
        if not images:
            raise EdgecapError("caption dataset is empty (no images in this split)")
        self.images = images
        self.source = source
        self.vocab = vocab
        self.max_len = max_len
        self.seed = seed
        self.augment = augment
        self.extra = extra  # (item, rng) -> tuple of tensors, or None
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict:
        item = self.images[index]
        rng = np.random.default_rng([self.seed, self.epoch, index]) if self.augment else None
        inputs, mask = self.source.load(item, rng)
        tokens = [torch.tensor(self.vocab.encode(list(c), self.max_len)) for c in item.captions]
        extra = ()
        if self.extra is not None:
            # stream 1: augmentation keeps stream [seed, epoch, index] unchanged
            extra = tuple(self.extra(item, np.random.default_rng([self.seed, self.epoch, index, 1])))
        return {"index": index, "inputs": inputs, "mask": mask, "tokens": tokens, "extra": extra}


@dataclass
class Batch:
    indices: torch.Tensor  # [B] dataset indices
    inputs: torch.Tensor  # images [B, 3, H, W] or features [B, N, D]
    mask: torch.Tensor | None  # [B, N] for features, None for images
    tokens: torch.Tensor  # [R, L + 1]: BOS, words, EOS, pad
    owner: torch.Tensor  # [R] image (batch position) of each caption row
    extra: tuple = ()  # extra encoder inputs per image, batch first (e.g. memory_tokens [B, k, length])

    def to(self, device) -> Batch:
        mask = None if self.mask is None else self.mask.to(device)
        return Batch(self.indices, self.inputs.to(device), mask, self.tokens.to(device), self.owner.to(device),
                     tuple(t.to(device) for t in self.extra))

    @property
    def size(self) -> int:
        return self.indices.shape[0]


def collate(items: list[dict], pad_id: int = 0) -> Batch:
    rows = [t for it in items for t in it["tokens"]]
    owner = torch.tensor([b for b, it in enumerate(items) for _ in it["tokens"]], dtype=torch.long)
    width = max(len(t) for t in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for r, t in enumerate(rows):
        tokens[r, : len(t)] = t
    masks = [it["mask"] for it in items]
    return Batch(
        indices=torch.tensor([it["index"] for it in items], dtype=torch.long),
        inputs=torch.stack([it["inputs"] for it in items]),
        mask=None if masks[0] is None else torch.stack(masks),
        tokens=tokens,
        owner=owner,
        extra=tuple(torch.stack(parts) for parts in zip(*(it.get("extra", ()) for it in items), strict=True)),
    )


class EpochBatchSampler(Sampler):
    """Shuffled batches of dataset indices, sharded over ranks, resumable mid-epoch.

    The permutation of epoch e comes from a generator seeded with seed + e (as
    DistributedSampler does); rank r takes every world-th index after padding the permutation
    to a multiple of world, so every rank runs the same number of steps. `set_epoch(e, start)`
    skips the first `start` batches without loading them.
    """

    def __init__(self, n: int, batch_size: int, seed: int = 0, rank: int = 0, world: int = 1,
                 shuffle: bool = True, drop_last: bool = False):
        if batch_size < 1:
            raise EdgecapError(f"batch_size={batch_size}, expected >= 1")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world, self.shuffle, self.drop_last = rank, world, shuffle, drop_last
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def _indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        total = -(-self.n // self.world) * self.world
        order += order[: total - self.n]
        return order[self.rank :: self.world]

    def batches_per_epoch(self) -> int:
        per_rank = -(-self.n // self.world)
        if self.drop_last:
            return per_rank // self.batch_size
        return -(-per_rank // self.batch_size)

    def __len__(self) -> int:
        return self.batches_per_epoch() - self.start

    def __iter__(self):
        mine = self._indices()
        for b in range(self.start, self.batches_per_epoch()):
            yield mine[b * self.batch_size : (b + 1) * self.batch_size]
