"""Objects known to be in a frame, and the coverage area each is scored by (torch-free).

The one rule that the runtime's sources and detection files, `edgecap eval coverage` over
recorded runs and the demo model's metrics share: an object's area is its box's fraction of
the image or, with --area pixels, its mask's pixel fraction when known (else the box).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgecap.errors import EdgecapError

AREAS = ("box", "pixels")  # what an object's area fraction measures


def box_fraction(box, width: float, height: float) -> float:
    """Fraction of a width x height image covered by an inclusive pixel box (left, top, right,
    bottom), as ACVR's bounding_box and the synthetic world's boxes are: [0, 0, 9, 9] is 100 px."""
    left, top, right, bottom = box
    return min(1.0, (right - left + 1) * (bottom - top + 1) / float(width * height))


def clip_box(box, width: float, height: float) -> tuple[float, float, float, float] | None:
    """The part of an inclusive pixel box (left, top, right, bottom) inside a width x height
    frame, or None when no part of it is. A detector's box may reach past the frame's edges
    (COCO [-50, -50, 60, 60] on a 96 x 96 frame); only the visible part is in view."""
    left, top, right, bottom = (float(v) for v in box)
    left, top = max(left, 0.0), max(top, 0.0)
    right, bottom = min(right, width - 1.0), min(bottom, height - 1.0)
    if right - left + 1.0 <= 0.0 or bottom - top + 1.0 <= 0.0:
        return None
    return left, top, right, bottom


def check_area(area: str) -> str:
    """`area` if it is one of AREAS, else the one-line error every --area reader gives."""
    if area not in AREAS:
        raise EdgecapError(f"area {area!r}: expected one of {', '.join(AREAS)}")
    return area


def object_area(box, pixel_fraction: float | None, width: float, height: float, area: str = "box") -> float:
    """An object's coverage area by `area` (AREAS): its box, or its mask's pixel fraction when
    known (else the box, as the ACVR loader falls back). The one rule shared by `eval coverage`,
    the runtime's sources and detection files, and the demo model's metrics."""
    if check_area(area) == "pixels" and pixel_fraction is not None:
        return float(pixel_fraction)
    return box_fraction(box, width, height)


@dataclass(frozen=True)
class KnownObject:
    """An object known to be in a frame: ground truth or an external detector's output."""

    cls: str
    box: tuple[float, float, float, float]   # left, top, right, bottom in pixels, inclusive
    area: float                              # coverage area: fraction of the image, 0..1, by --area
    box_area: float | None = None            # the box's fraction of the image
    pixel_area: float | None = None          # the mask's pixel fraction, when the source knows it

    @classmethod
    def measured(cls, name: str, box, pixel_area: float | None, width: int, height: int,
                 area: str = "box") -> KnownObject:
        """An object whose coverage area is `area` (`object_area`), with both of its areas
        kept, so a recorded run can be re-scored by the other one. The box is clipped to the
        frame (`clip_box`) and its area is the visible part's; a box wholly outside has area 0
        (`objects_in_view` leaves such boxes out and counts them)."""
        visible = clip_box(box, width, height)
        if visible is None:
            return cls(name, tuple(float(v) for v in box), 0.0, 0.0, None if pixel_area is None else 0.0)
        return cls(name, visible, object_area(visible, pixel_area, width, height, area),
                   box_fraction(visible, width, height), None if pixel_area is None else float(pixel_area))

    @classmethod
    def from_record(cls, obj, area: str | None = None) -> KnownObject:
        """An object of a caption record (`to_json`) whose coverage area is `area`: "box", "pixels"
        (the mask's, else the box, as every source falls back) or None, the area the run used.
        Raises ValueError saying what is wrong with it."""
        if not isinstance(obj, dict) or not isinstance(obj.get("class"), str):
            raise ValueError(f"object {str(obj)[:60]!r} has no 'class'")
        key = {None: "area", "box": "box_area", "pixels": "pixel_area"}[area]
        if area == "pixels" and obj.get(key) is None:
            key = "box_area"
        value = obj.get(key)
        if value is None:
            raise ValueError(f"object {obj['class']!r} has no {key!r} (a record written before 24 Nov 2026 "
                             f"carries only the run's own 'area': leave out --area)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise ValueError(f"object {obj['class']!r}: {key} {value!r} is not a fraction of the image")
        box = tuple(float(v) for v in obj.get("box") or (0, 0, 0, 0))
        return cls(obj["class"], box, float(value), obj.get("box_area"), obj.get("pixel_area"))

    def to_json(self) -> dict:
        out = {"class": self.cls, "box": [round(float(v), 2) for v in self.box], "area": round(float(self.area), 6)}
        for key in ("box_area", "pixel_area"):
            if getattr(self, key) is not None:
                out[key] = round(float(getattr(self, key)), 6)
        return out


def objects_in_view(entries, width: int, height: int, area: str = "box") -> tuple[list[KnownObject], int]:
    """(the KnownObjects of (class, box, mask pixel fraction or None) entries in a width x height
    frame, their boxes clipped to it; how many boxes had no part inside it and were left out).
    Every source of boxes from outside (a detections file, a detector) builds its objects here."""
    kept, outside = [], 0
    for name, box, pixel_area in entries:
        if clip_box(box, width, height) is None:
            outside += 1
            continue
        kept.append(KnownObject.measured(name, box, pixel_area, width, height, area))
    return kept, outside


def class_areas(objects: list[KnownObject]) -> dict[str, float]:
    """{class: the largest coverage area of its objects}: the ground truth coverage scores a
    caption against, live (CoverageAnnotator) and over a recorded run (`eval coverage --records`)."""
    gt: dict[str, float] = {}
    for obj in objects:
        gt[obj.cls] = max(gt.get(obj.cls, 0.0), obj.area)
    return gt
