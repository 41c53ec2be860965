"""`--detections FILE`: objects per frame from an external detector, as edgecap's JSON Lines or
as a COCO detection results array (coco_results.py), told apart by the content.

One line per frame:

    {"frame_id": 12, "objects": [{"class": "cup", "box": [l, t, r, b], "area": 0.031}, ...]}

`frame_id` is the frame's position in the source (video frame number, index in the folder's
name order, ACVR frame order); "frame" is accepted as the same key, so the ground-truth sidecar
the synthetic world writes beside its video (`video/tabletop.jsonl`) works as it is. Boxes are
inclusive pixel boxes, as ACVR writes them. Coverage scores each object by its box's fraction
of the frame (`--area box`, the default, as `edgecap eval coverage`); the optional `area` is
the object's own mask fraction (a segmenter's, or the world's pixel count), used with
`--area pixels` (the box when a record has none). Class names are normalised as the ACVR
loader does (tvmonitor -> television).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from edgecap.contract.objects import check_area, objects_in_view
from edgecap.data.classes import canonical_class
from edgecap.data.coco_categories import COCO
from edgecap.errors import EdgecapError, require
from edgecap.jsonio import BOM, json_lines, read_bytes

from .coco_results import (
    DEFAULT_MIN_SCORE,
    image_key,
    is_coco_results,
    mask_fraction,
    read_coco_results,
)
from .coco_results import finite_number as _number
from .sources import KnownObject


def _object(obj, where: str) -> tuple[str, tuple[float, float, float, float], float | None]:
    if not isinstance(obj, dict):
        raise EdgecapError(f"{where}: expected an object, got {type(obj).__name__}")
    cls = obj.get("class")
    if not isinstance(cls, str) or not cls.strip():
        raise EdgecapError(f"{where}: missing 'class' name")
    box = obj.get("box")
    if not isinstance(box, (list, tuple)) or len(box) != 4:
        raise EdgecapError(f"{where}: 'box' must be [left, top, right, bottom], got {box!r}")
    left, top, right, bottom = (_number(v, f"{where} 'box'") for v in box)
    if right < left or bottom < top:
        raise EdgecapError(f"{where}: 'box' {box!r} has right < left or bottom < top")
    area = obj.get("area")
    if area is not None:
        area = _number(area, f"{where} 'area'")
        if not 0.0 <= area <= 1.0:
            raise EdgecapError(f"{where}: 'area' {area} is not a fraction of the image in [0, 1]")
    return canonical_class(cls), (left, top, right, bottom), area


def _refuse_annotations(raw: bytes, path: Path) -> None:
    """A COCO annotation file (ground truth: a JSON object with images, annotations and
    categories) given where a detector's output belongs is said to be one, not read as a JSON
    Lines file whose first line lacks a frame_id."""
    text = raw[len(BOM):] if raw.startswith(BOM) else raw
    if not text.lstrip().startswith(b"{"):
        return
    try:
        doc = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):  # several lines: JSON Lines, read as such
        return
    if isinstance(doc, dict) and "annotations" in doc and "images" in doc:
        raise EdgecapError(f"--detections {path}: a COCO annotation file (ground truth: images, annotations, "
                           "categories), not detector results; give the detector's output (a COCO results array "
                           "[{\"image_id\", \"category_id\", \"bbox\", \"score\"}, ...] or edgecap's JSON Lines), "
                           "or pass this file as --categories FILE for its class names")


def _has_pycocotools() -> bool:
    return importlib.util.find_spec("pycocotools") is not None


def _results_array(raw: bytes):
    """The parsed document when the whole file is one JSON array, else None (JSON Lines)."""
    text = raw[len(BOM):] if raw.startswith(BOM) else raw
    if not text.lstrip().startswith(b"["):
        return None
    try:
        return json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


class Detections:
    """{frame: objects} read from a detections file; each object's coverage area by `area`.

    JSON Lines files key frames by frame_id (the frame's position in the source); COCO results
    by image_id, which is a folder image's file stem (`by_name`) or else the frame's position.
    """

    def __init__(self, path: str | Path, area: str = "box", min_score: float = DEFAULT_MIN_SCORE,
                 categories=None, category_base: str = "auto"):
        self.path = Path(path)
        self.area = check_area(area)
        self.note = ""
        self._frames: dict[int | str, list] = {}
        self._seen: set[int | str] = set()
        self.outside = 0  # boxes of captioned frames with no part inside the frame: left out
        self._measure_masks = False
        raw = read_bytes(self.path, where=f"--detections {self.path}")
        _refuse_annotations(raw, self.path)
        doc = _results_array(raw)
        self.coco = doc is not None
        self.categories = (categories or COCO) if self.coco else None  # the class set coverage reads
        # `[]`: a detector that found nothing in any frame (detectron2, ultralytics write that): every
        # frame has no objects, as a frame whose boxes were all under --min-score
        self.found_nothing = doc == []
        if self.found_nothing:
            self.note = "an empty results array: the detector found nothing, every frame has no objects"
        elif self.coco:
            if not is_coco_results(doc):
                raise EdgecapError(f"--detections {self.path}: a JSON array, but not COCO detection results "
                                   "(expected [{\"image_id\", \"category_id\", \"bbox\": [x, y, w, h], \"score\"}, ...])")
            frames, skipped = read_coco_results(doc, f"--detections {self.path}", categories or COCO, min_score,
                                                category_base)
            self._frames = {key: [(o.cls, o.box, o.segmentation) for o in objs] for key, objs in frames.items()}
            self.note = skipped.note(min_score)
            if any(seg is not None for objs in self._frames.values() for *_, seg in objs):
                self._measure_masks = _has_pycocotools()
                if self.area == "pixels" and not self._measure_masks:
                    require("pycocotools.mask", "coco", "the area of a detection's segmentation")
        else:
            self._read_lines(raw)
        if not self._frames and not self.found_nothing:
            raise EdgecapError(f"--detections {self.path}: no frames in the file")

    def _read_lines(self, raw: bytes) -> None:
        for line in json_lines(raw):
            where = f"--detections {self.path}:{line.number}"
            if not line.utf8:
                raise EdgecapError(f"{where}: not UTF-8 text")
            if line.error is not None:
                raise EdgecapError(f"{where}: {line.error}")
            rec = line.value
            if not isinstance(rec, dict):
                raise EdgecapError(f"{where}: expected an object with frame_id and objects")
            frame_id = rec.get("frame_id", rec.get("frame"))
            if isinstance(frame_id, bool) or not isinstance(frame_id, int):
                raise EdgecapError(f"{where}: 'frame_id' must be an integer, got {frame_id!r}")
            objects = rec.get("objects")
            if not isinstance(objects, list):
                raise EdgecapError(f"{where}: 'objects' must be a list")
            if frame_id in self._frames:
                raise EdgecapError(f"{where}: frame_id {frame_id} appears twice")
            self._frames[frame_id] = [_object(o, f"{where} object {i}") for i, o in enumerate(objects)]

    def __len__(self) -> int:
        return len(self._frames)

    def frame_key(self, frame_id: int, image_name: str | None = None) -> int | str:
        """A COCO image_id names a folder image by its file stem; everything else is the
        frame's position in the source."""
        if self.coco and image_name is not None:
            return image_key(Path(image_name).stem)
        return int(frame_id)

    def objects(self, frame_id: int, width: int, height: int,
                image_name: str | None = None) -> list[KnownObject] | None:
        """The frame's objects, or None when the file says nothing about this frame."""
        key = self.frame_key(frame_id, image_name)
        entry = [] if self.found_nothing else self._frames.get(key)
        if entry is None:
            return None
        self._seen.add(key)
        objects, outside = objects_in_view([(cls, box, self._mask_area(mask, width, height)) for cls, box, mask in entry],
                                           width, height, self.area)
        self.outside += outside
        return objects

    def _mask_area(self, mask, width: int, height: int) -> float | None:
        if mask is None or isinstance(mask, float):
            return mask
        # measured even for --area box when pycocotools is there: the records then carry
        # pixel_area, and `eval coverage --records --area pixels` can re-score the run
        return mask_fraction(mask, width, height) if self._measure_masks else None

    @property
    def id_name(self) -> str:
        return "image_ids" if self.coco else "frame_ids"

    def unmatched(self) -> list[int | str]:
        """The file's frames / image_ids that no captioned frame has asked for yet."""
        return _ordered(k for k in self._frames if k not in self._seen)

    def report(self) -> dict:
        """What the run's summary.json says about the file: its ids, and those no captioned
        frame matched (a misnamed folder, a results file of another split, a stopped run)."""
        unmatched = self.unmatched()
        return {"path": str(self.path), "format": "coco results" if self.coco else "jsonl",
                "ids": len(self), "unmatched_ids": len(unmatched), "unmatched_examples": unmatched[:5],
                "boxes_outside_frame": self.outside}

    def outside_note(self) -> str:
        """The line a run ends with when boxes lay wholly outside their frames ('' if none)."""
        if not self.outside:
            return ""
        return (f"--detections {self.path}: {self.outside} box{'es' * (self.outside != 1)} lay wholly outside "
                "the captioned frame: left out of the objects in view (boxes reaching past an edge count by "
                "their visible part)")

    def check_folder(self, images: list[Path], where: str) -> None:
        """Before a run over a folder: refuse a file none of whose ids names one of its images
        (COCO results: a file stem; JSON Lines: a position in name order), in one line naming
        a few of each, instead of captioning the whole folder with no objects."""
        expected = [self.frame_key(i, p.name) for i, p in enumerate(images)]
        if self.found_nothing or set(expected) & self._frames.keys():
            return
        ids = _ordered(self._frames)
        what = ("file stems" if self.coco else "positions") + f" of its {len(images)} images"
        raise EdgecapError(f"--detections {self.path}: none of its {len(ids)} {self.id_name} ({few_ids(ids)}) is one "
                           f"of the {what} in {where} ({few_ids(expected)})"
                           + ("; COCO results name a folder's images by file stem, integers for all-digit stems"
                              if self.coco else ""))


def _ordered(keys) -> list[int | str]:
    return sorted(keys, key=lambda k: (isinstance(k, str), k))


def few_ids(keys: list, n: int = 3) -> str:
    """The first n ids, and "..." when there are more (for one-line messages)."""
    return ", ".join(repr(k) for k in keys[:n]) + (", ..." if len(keys) > n else "")


# One detections object ({"class", "box", "area"?}) checked: the ROS 2 node's JSON detections
# topic carries the same objects as a --detections line (edgecap/ros2/detections.py).
parse_object = _object
