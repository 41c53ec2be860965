"""Karpathy splits of COCO (`dataset_coco.json`), torch-free.

The file lists every image once:

    {"images": [{"filepath": "val2014", "filename": "COCO_val2014_000000391895.jpg",
                 "cocoid": 391895, "split": "train" | "val" | "test" | "restval",
                 "sentences": [{"tokens": ["a", "man", ...], "raw": "A man ..."}, ...]}, ...]}

`restval` (the 30k COCO-val images not in Karpathy's val/test) is folded into `train`, as
every captioning paper since Karpathy & Fei-Fei does. Captions are re-tokenised with
`edgecap.contract.vocab.tokenize` (lower-case, punctuation stripped) from the `tokens` field (or
`raw` when tokens are absent), so training, SCST rewards and evaluation see the same words.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edgecap.contract.vocab import tokenize
from edgecap.errors import EdgecapError
from edgecap.jsonio import read_json

# Where a reader who has never had one gets a split file (docs/training.md#getting-coco).
KARPATHY_SOURCE = ("COCO's is dataset_coco.json in Karpathy's caption_datasets.zip "
                   "(docs/training.md#getting-coco); `edgecap data synth` writes one for the "
                   "synthetic world")

SPLITS = ("train", "val", "test")
FOLD = {"train": "train", "restval": "train", "val": "val", "test": "test"}  # raw split -> ours


@dataclass(frozen=True)
class KarpathyImage:
    image_id: str  # str(cocoid): the HDF5 key prefix and the objects.json key
    path: str  # relative to the image root: filepath/filename, or where `find_image` found it
    split: str  # train | val | test (restval folded into train)
    captions: tuple[tuple[str, ...], ...]  # tokenised references

    def caption_strings(self) -> list[str]:
        return [" ".join(c) for c in self.captions]


@dataclass
class KarpathySplits:
    source: Path
    train: list[KarpathyImage]
    val: list[KarpathyImage]
    test: list[KarpathyImage]

    def __getitem__(self, split: str) -> list[KarpathyImage]:
        if split not in SPLITS:
            raise EdgecapError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        return getattr(self, split)

    def counts(self) -> dict[str, int]:
        return {s: len(self[s]) for s in SPLITS}


def _caption_tokens(sentence, where: str) -> tuple[str, ...]:
    if not isinstance(sentence, dict):
        raise EdgecapError(f"{where}: expected an object with 'tokens' or 'raw', got {type(sentence).__name__}")
    if "tokens" in sentence and isinstance(sentence["tokens"], list):
        return tuple(tokenize(" ".join(str(t) for t in sentence["tokens"])))
    if "raw" in sentence:
        return tuple(tokenize(sentence["raw"]))
    raise EdgecapError(f"{where}: has neither 'tokens' nor 'raw'")


def image_id_of(entry: dict, index: int) -> str:
    """The id an image goes by (HDF5 key prefix, results image_id): cocoid, else imgid (Flickr
    files), else its position in the file."""
    return str(entry.get("cocoid", entry.get("imgid", index)))


def image_candidates(entry: dict) -> list[str]:
    """Where a split file's image may be, relative to the image folder, in the order tried:
    Karpathy's filepath/filename (COCO 2014: val2014/COCO_val2014_000000391895.jpg), the file
    name alone (a flat folder), then COCO 2017's name for the same picture
    (train2017/ or val2017/000000391895.jpg: the 2017 release re-split the 2014 images and
    renamed them to their zero-padded ids, and it is what COCO's site offers today)."""
    names = [str(Path(str(entry.get("filepath", ""))) / str(entry["filename"])), str(entry["filename"])]
    cocoid = entry.get("cocoid")
    if isinstance(cocoid, int) and not isinstance(cocoid, bool) and cocoid >= 0:
        stem = f"{cocoid:012d}.jpg"
        names += [f"train2017/{stem}", f"val2017/{stem}", stem]
    return list(dict.fromkeys(names))


def find_image(root: Path, entry: dict) -> str | None:
    """The first of `image_candidates(entry)` that is a file under `root`, or None."""
    return next((rel for rel in image_candidates(entry) if (root / rel).is_file()), None)


def missing_image(root: Path, entry: dict) -> str:
    """How a missing image is named in errors: the split file's own path, and the other
    places looked in."""
    first, *others = image_candidates(entry)
    tried = f" (nor {', '.join(others)})" if others else ""
    return f"image file {root / first} does not exist{tried}"


def load_karpathy(
    path: str | os.PathLike, image_root: str | os.PathLike | None = None, splits=SPLITS
) -> KarpathySplits:
    """Read `dataset_coco.json`; with `image_root`, every listed image of `splits` must exist.

    Errors name the file, the image (cocoid) and the field: an image without captions, a
    caption that tokenises to nothing, a missing image file, an unknown split name.
    """
    path = Path(path)
    if not path.is_file():
        raise EdgecapError(f"Karpathy split file {path} does not exist; {KARPATHY_SOURCE}")

    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise EdgecapError(f"{path}: expected an object with an 'images' list (Karpathy dataset_coco.json)")
    root = Path(image_root) if image_root is not None else None
    if root is not None and not root.is_dir():
        raise EdgecapError(f"image folder {root} does not exist")
    out: dict[str, list[KarpathyImage]] = {s: [] for s in SPLITS}
    seen: set[str] = set()
    for i, entry in enumerate(data["images"]):
        where = f"{path}: images[{i}]"
        if not isinstance(entry, dict):
            raise EdgecapError(f"{where}: expected an object, got {type(entry).__name__}")
        for key in ("filename", "split", "sentences"):
            if key not in entry:
                raise EdgecapError(f"{where}: missing field {key!r}")
        image_id = image_id_of(entry, i)
        where = f"{path}: image {image_id}"
        split = FOLD.get(entry["split"])
        if split is None:
            raise EdgecapError(f"{where}: split {entry['split']!r}, expected train, val, test or restval")
        if image_id in seen:
            raise EdgecapError(f"{where}: cocoid listed twice")
        seen.add(image_id)
        sentences = entry["sentences"]
        if not isinstance(sentences, list) or not sentences:
            raise EdgecapError(f"{where}: empty caption list (field 'sentences')")
        captions = []
        for j, sentence in enumerate(sentences):
            tokens = _caption_tokens(sentence, f"{where}: sentences[{j}]")
            if not tokens:
                raise EdgecapError(f"{where}: sentences[{j}] is an empty caption")
            captions.append(tokens)
        if split not in splits:
            continue
        rel = image_candidates(entry)[0] if root is None else find_image(root, entry)
        if rel is None:
            raise EdgecapError(f"{where}: {missing_image(root, entry)}")
        out[split].append(KarpathyImage(image_id, rel, split, tuple(captions)))
    return KarpathySplits(path, out["train"], out["val"], out["test"])
