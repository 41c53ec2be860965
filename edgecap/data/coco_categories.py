"""Category ids of COCO detection results: COCO's own 80 categories by their 1..90 ids, or the
categories of a dataset file (`--categories`). Torch-free.

A results file (detectron2's coco_instances_results.json, mmdetection's results.bbox.json,
ultralytics' predictions.json) names classes only by `category_id`; the names live in the
dataset's annotation file. Built in is the list of the official instances_val2017.json, whose
ids skip 12, 26, 29, 30, 45, 66, 68, 69, 71 and 83.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from edgecap.errors import EdgecapError, require
from edgecap.jsonio import read_bytes

# instances_val2017.json "categories": id -> name (the official spelling; canonical_class maps
# "tv" to "television" as everywhere else)
COCO_CATEGORIES: dict[int, str] = {
    1: "person", 2: "bicycle", 3: "car", 4: "motorcycle", 5: "airplane", 6: "bus", 7: "train",
    8: "truck", 9: "boat", 10: "traffic light", 11: "fire hydrant", 13: "stop sign",
    14: "parking meter", 15: "bench", 16: "bird", 17: "cat", 18: "dog", 19: "horse", 20: "sheep",
    21: "cow", 22: "elephant", 23: "bear", 24: "zebra", 25: "giraffe", 27: "backpack",
    28: "umbrella", 31: "handbag", 32: "tie", 33: "suitcase", 34: "frisbee", 35: "skis",
    36: "snowboard", 37: "sports ball", 38: "kite", 39: "baseball bat", 40: "baseball glove",
    41: "skateboard", 42: "surfboard", 43: "tennis racket", 44: "bottle", 46: "wine glass",
    47: "cup", 48: "fork", 49: "knife", 50: "spoon", 51: "bowl", 52: "banana", 53: "apple",
    54: "sandwich", 55: "orange", 56: "broccoli", 57: "carrot", 58: "hot dog", 59: "pizza",
    60: "donut", 61: "cake", 62: "chair", 63: "couch", 64: "potted plant", 65: "bed",
    67: "dining table", 70: "toilet", 72: "tv", 73: "laptop", 74: "mouse", 75: "remote",
    76: "keyboard", 77: "cell phone", 78: "microwave", 79: "oven", 80: "toaster", 81: "sink",
    82: "refrigerator", 84: "book", 85: "clock", 86: "vase", 87: "scissors", 88: "teddy bear",
    89: "hair drier", 90: "toothbrush",
}


CATEGORY_BASES = ("auto", "0", "1")  # --category-base


@dataclass(frozen=True)
class Categories:
    """id -> class name, and where the names came from (for error messages)."""

    names: dict[int, str]
    origin: str
    # a YOLO data.yaml numbers its names from 0; ultralytics' predictions.json writes them as
    # given (before 8.3.x) or + 1 (list(range(1, nc + 1)) since): see for_results
    yolo_indices: bool = False

    def for_results(self, ids: set[int], base: str = "auto") -> Categories:
        """The id scheme of a results file with these category ids. `base` "auto": a dataset's
        own ids (COCO's 1..90, an annotation file's), and for data.yaml names ids from 1 unless
        the file holds an id 0 (only the older 0-based writer produces one); "0" or "1": ids are
        class indices counted from that base (`indexed`), whatever the list."""
        if base not in CATEGORY_BASES:
            raise EdgecapError(f"--category-base {base!r}: expected one of {', '.join(CATEGORY_BASES)}")
        if base != "auto":
            return self.indexed(int(base))
        if not self.yolo_indices or 0 in ids:
            return self
        return self.indexed(1)

    def indexed(self, base: int) -> Categories:
        """Ids as a detector's class indices from `base`: a data.yaml's own indices; for other
        lists the position in id order, so COCO's 80 classes are 0..79 / 1..80 (what a
        COCO-trained YOLO writes for a dataset it does not know as COCO), not 1..90."""
        indices = self.names if self.yolo_indices else dict(enumerate(self.names[k] for k in sorted(self.names)))
        return Categories({base + i: n for i, n in indices.items()}, f"{self.origin}, ids as class indices from {base}")


COCO = Categories(COCO_CATEGORIES, "COCO's 80 categories")


def _name(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise EdgecapError(f"{where}: expected a class name, got {value!r}")
    return value


def _from_coco_json(doc, where: str) -> dict[int, str]:
    cats = doc.get("categories") if isinstance(doc, dict) else None
    if not isinstance(cats, list) or not cats:
        raise EdgecapError(f"{where}: no \"categories\" list (expected a COCO-format annotation "
                           "file such as instances_val2017.json, or a YOLO data.yaml with names)")
    names: dict[int, str] = {}
    for i, cat in enumerate(cats):
        at = f"{where} categories[{i}]"
        if not isinstance(cat, dict) or isinstance(cat.get("id"), bool) or not isinstance(cat.get("id"), int):
            raise EdgecapError(f"{at}: expected {{\"id\": <integer>, \"name\": ...}}, got {cat!r}")
        if cat["id"] in names:
            raise EdgecapError(f"{at}: id {cat['id']} appears twice")
        names[cat["id"]] = _name(cat.get("name"), f"{at} 'name'")
    return names


def _from_yolo_yaml(raw: bytes, where: str) -> dict[int, str]:
    yaml = require("yaml", "coco", "reading a YOLO data.yaml")
    try:
        doc = yaml.safe_load(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise EdgecapError(f"{where}: not a YAML file ({str(exc).splitlines()[0]})") from None
    names = doc.get("names") if isinstance(doc, dict) else None
    if isinstance(names, list) and names:
        return {i: _name(n, f"{where} names[{i}]") for i, n in enumerate(names)}
    if isinstance(names, dict) and names and all(isinstance(k, int) and not isinstance(k, bool) for k in names):
        return {k: _name(n, f"{where} names[{k}]") for k, n in names.items()}
    raise EdgecapError(f"{where}: 'names' must be a list of class names or a {{index: name}} "
                       f"mapping, got {names!r}")


def _distinct(names: dict[int, str], where: str) -> dict[int, str]:
    """Refuse a list naming one class twice (compared lower-case, spaces folded): its objects
    and a caption's nouns could not tell the two ids apart."""
    first: dict[str, int] = {}
    for key, name in names.items():
        norm = " ".join(name.lower().split())
        if norm in first:
            raise EdgecapError(f"{where}: class name {name!r} appears twice (ids {first[norm]} and {key}); "
                               "class names must be distinct")
        first[norm] = key
    return names


def load_categories(path: str | Path, flag: str = "--categories") -> Categories:
    """`--categories FILE`: a COCO-format annotation file's "categories" (any JSON document with
    that key), or an ultralytics data.yaml's `names` (.yaml / .yml). `flag` names the option in
    messages (`eval coverage --classes FILE` reads the same files)."""
    where = f"{flag} {path}"
    raw = read_bytes(path, where=where)
    if Path(path).suffix.lower() in (".yaml", ".yml"):
        return Categories(_distinct(_from_yolo_yaml(raw, where), where), str(path), yolo_indices=True)
    try:
        doc = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise EdgecapError(f"{where}: not a JSON file ({exc})") from None
    return Categories(_distinct(_from_coco_json(doc, where), where), str(path))
