"""COCO detection results as `--detections`: the JSON array detectron2's COCOEvaluator
(coco_instances_results.json), mmdetection's `--format-only` (results.bbox.json / .segm.json)
and ultralytics' `val save_json=True` (predictions.json) write:

    [{"image_id": 391895, "category_id": 47, "bbox": [x, y, w, h], "score": 0.93,
      "segmentation": {"size": [h, w], "counts": "..."}}, ...]

bbox is the box's top-left corner and size in pixels (floats); it becomes the inclusive box
[x, y, x + w - 1, y + h - 1], so its coverage area is w * h as COCO measures it. Records under
`min_score`, crowd regions and empty boxes are skipped and counted. image_id is an integer, or
(ultralytics, for a file stem that is not a number) a string.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgecap.data.classes import canonical_class
from edgecap.data.coco_categories import Categories
from edgecap.errors import EdgecapError, require

# detectron2's demo (--confidence-threshold) and Visualizer examples draw detections from 0.5;
# results files are dumped at evaluation thresholds (0.05, ultralytics 0.001), far below it.
DEFAULT_MIN_SCORE = 0.5
RESULT_KEYS = ("image_id", "category_id", "bbox")


def is_coco_results(doc) -> bool:
    """A top-level array whose first element has image_id, category_id and bbox."""
    return isinstance(doc, list) and bool(doc) and isinstance(doc[0], dict) and all(k in doc[0] for k in RESULT_KEYS)


def image_key(image_id) -> int | str:
    """The key a COCO image_id and a file stem share: digits compare as integers, so
    000000391895.jpg is image 391895 (ultralytics writes int(stem) when the stem is numeric)."""
    text = str(image_id).strip()
    return int(text) if text.isdigit() else text


def finite_number(value, where: str) -> float:
    # json.loads reads NaN and Infinity, which a detector's writer emits for a degenerate box
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise EdgecapError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


@dataclass
class Skipped:
    low_score: int = 0
    crowd: int = 0
    empty_box: int = 0

    def note(self, min_score: float) -> str:
        parts = [f"{n} {what}" for n, what in ((self.low_score, f"under --min-score {min_score:g}"),
                                               (self.crowd, "crowd regions"),
                                               (self.empty_box, "with an empty box")) if n]
        return f"skipped {', '.join(parts)}" if parts else ""


@dataclass
class CocoObject:
    cls: str
    box: tuple[float, float, float, float]
    segmentation: dict | list | None = None


def _segmentation(seg, where: str):
    if seg is None:
        return None
    if isinstance(seg, dict) and isinstance(seg.get("size"), list) and len(seg["size"]) == 2 and "counts" in seg:
        return seg
    if isinstance(seg, list) and seg and all(isinstance(p, list) and len(p) >= 6 for p in seg):
        return seg
    raise EdgecapError(f"{where}: 'segmentation' must be an RLE {{\"size\": [h, w], \"counts\": ...}} "
                       f"or a list of polygons, got {str(seg)[:60]}")


def read_coco_results(doc: list, where: str, categories: Categories, min_score: float,
                      category_base: str = "auto") -> tuple[dict[int | str, list[CocoObject]], Skipped]:
    """{image key: objects} from a parsed results array; a bad record is a one-line error
    naming its index, an unknown category id one naming the category list."""
    ids = {r.get("category_id") for r in doc if isinstance(r, dict)}
    categories = categories.for_results({i for i in ids if isinstance(i, int)}, category_base)
    frames: dict[int | str, list[CocoObject]] = {}
    skipped = Skipped()
    for i, rec in enumerate(doc):
        at = f"{where} [{i}]"
        if not isinstance(rec, dict) or any(k not in rec for k in RESULT_KEYS):
            raise EdgecapError(f"{at}: expected an object with {', '.join(RESULT_KEYS)}, got {str(rec)[:80]}")
        image_id = rec["image_id"]
        if isinstance(image_id, bool) or not isinstance(image_id, (int, str)) or not str(image_id).strip():
            raise EdgecapError(f"{at}: 'image_id' must be an integer or a file stem, got {image_id!r}")
        cat = rec["category_id"]
        if isinstance(cat, bool) or not isinstance(cat, int):
            raise EdgecapError(f"{at}: 'category_id' must be an integer, got {cat!r}")
        if cat not in categories.names:
            known = sorted(categories.names)
            raise EdgecapError(f"{at}: category_id {cat} is not in {categories.origin} "
                               f"(ids {known[0]}-{known[-1]}); give the dataset's --categories FILE"
                               + (" or --category-base 0|1 if it is a class index" if category_base == "auto" else ""))
        bbox = rec["bbox"]
        if not isinstance(bbox, list) or len(bbox) != 4:
            raise EdgecapError(f"{at}: 'bbox' must be [x, y, width, height], got {bbox!r}")
        x, y, w, h = (finite_number(v, f"{at} 'bbox'") for v in bbox)
        if w < 0 or h < 0:
            raise EdgecapError(f"{at}: 'bbox' {bbox!r} has a negative width or height")
        score = finite_number(rec["score"], f"{at} 'score'") if "score" in rec else None
        segmentation = _segmentation(rec.get("segmentation"), at)
        frames.setdefault(image_key(image_id), [])  # a frame with only skipped boxes is still known
        if score is not None and score < min_score:
            skipped.low_score += 1
        elif rec.get("iscrowd"):
            skipped.crowd += 1
        elif w == 0 or h == 0:
            skipped.empty_box += 1
        else:
            box = (x, y, x + max(w - 1.0, 0.0), y + max(h - 1.0, 0.0))
            frames[image_key(image_id)].append(CocoObject(canonical_class(categories.names[cat]), box, segmentation))
    return frames, skipped


def mask_fraction(segmentation, width: int, height: int) -> float:
    """The fraction of the image a result's mask covers, by pycocotools (an RLE carries its own
    image size; polygons are rasterised at the frame's)."""
    mask = require("pycocotools.mask", "coco", "the area of a detection's segmentation")
    if isinstance(segmentation, dict):
        h, w = segmentation["size"]
        rle = segmentation if isinstance(segmentation["counts"], (str, bytes)) else mask.frPyObjects(segmentation, h, w)
    else:
        h, w = height, width
        rle = mask.merge(mask.frPyObjects(segmentation, h, w))
    return min(1.0, float(mask.area(rle)) / float(h * w))
