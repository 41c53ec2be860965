"""`--detections FILE`: objects per frame from an external detector, as JSON Lines.

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

import math
from pathlib import Path

from edgecap.errors import EdgecapError
from edgecap.jsonio import json_lines, read_bytes

from .sources import KnownObject


def _number(value, where: str) -> float:
    # json.loads reads NaN and Infinity, which a detector's writer emits for a degenerate box
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise EdgecapError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _object(obj, where: str) -> tuple[str, tuple[float, float, float, float], float | None]:
    from edgecap.data.classes import canonical_class

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


class Detections:
    """{frame_id: objects} read from a JSONL file; each object's coverage area by `area`."""

    def __init__(self, path: str | Path, area: str = "box"):
        from edgecap.data.acvr import check_area

        self.path = Path(path)
        self.area = check_area(area)
        self._frames: dict[int, list] = {}
        for line in json_lines(read_bytes(self.path, where=f"--detections {self.path}")):
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
        if not self._frames:
            raise EdgecapError(f"--detections {self.path}: no frames in the file")

    def __len__(self) -> int:
        return len(self._frames)

    def objects(self, frame_id: int, width: int, height: int) -> list[KnownObject] | None:
        """The frame's objects, or None when the file says nothing about this frame."""
        entry = self._frames.get(int(frame_id))
        if entry is None:
            return None
        return [KnownObject.measured(cls, box, mask_area, width, height, self.area) for cls, box, mask_area in entry]
