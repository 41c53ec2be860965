"""ACRV Robotic Vision Challenge ground truth, torch-free.

Layout (one folder per sequence):

    ROOT/000000/labels.json      {"<frame id>": {"_metadata": {"mask_name": "0.png", ...},
                                                 "<instance id>": {"class": ..., "mask_id": ...,
                                                    "bounding_box": [l, t, r, b], "num_pixels": ...}}}
    ROOT/000000/0.png            instance mask, 8 or 16 bit; pixel value == mask_id
    ROOT/000000/000000.png       RGB frame (or .jpg; or under a separate images root)

Read as the challenge's own loader (rvchallenge-evaluation `gt_loader.py`) reads it: classes
by its class list and synonyms (`edgecap.data.classes.challenge_class`; other names dropped,
`none`/background instances kept), boxes inclusive and truncated to int (from the mask when a
label has none), masks through `cv2.IMREAD_ANYDEPTH` (a 3-channel mask becomes greyscale;
`mask_channel` is ignored, as there), `num_pixels` used when > 0 and otherwise counted in the
mask. An object's area fraction is that of its bounding box (`area="box"`, SMArT's definition)
or of its mask pixels (`area="pixels"`). The image id of a frame is "<sequence>/<frame id>".
docs/coverage.md lists where, and why, edgecap still differs from the challenge's loader.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edgecap.contract.objects import box_fraction, check_area
from edgecap.data.classes import ACVR_CLASSES, BACKGROUND_CLASS, challenge_class
from edgecap.errors import EdgecapError
from edgecap.jsonio import read_json

RGB_SUFFIXES = (".png", ".jpg", ".jpeg")
_KNOWN = frozenset(ACVR_CLASSES)


@dataclass
class ACVRObject:
    instance_id: str
    cls: str                     # the challenge's class name; "none" for background
    raw_class: str               # as written in labels.json
    box: tuple[int, int, int, int]   # left, top, right, bottom, inclusive
    area: float                  # fraction of the image, 0..1, by the frame's area kind
    area_source: str             # "box" | "mask-box" (box from the mask) | "num_pixels" | "mask"
    mask_id: int | None = None
    box_area: float | None = None    # the box's fraction, whatever the area kind
    pixel_area: float | None = None  # the mask's pixel fraction: by area "pixels", or from num_pixels

    @property
    def known(self) -> bool:
        """An object class of the challenge (not its background class)."""
        return self.cls in _KNOWN


@dataclass
class ACVRFrame:
    image_id: str                # "<sequence>/<frame id>"
    sequence: str
    frame_id: str
    rgb_path: Path | None        # None when no RGB frame was found
    mask_path: Path | None
    width: int | None
    height: int | None
    objects: list[ACVRObject] = field(default_factory=list)   # background instances included
    unlisted: list[str] = field(default_factory=list)  # raw classes of dropped instances
    area_kind: str = "box"

    @property
    def foreground(self) -> list[ACVRObject]:
        """The objects a caption can name: the challenge's `none` (background) instances left out."""
        return [o for o in self.objects if o.cls != BACKGROUND_CLASS]

    def class_areas(self) -> dict[str, float]:
        """{class: largest area fraction of any of its instances} (coverage ground truth)."""
        out: dict[str, float] = {}
        for obj in self.foreground:
            out[obj.cls] = max(out.get(obj.cls, 0.0), obj.area)
        return out


def normalize_image_id(image_id) -> str:
    """'000000/12' and '000000/000012' name the same frame: zero-pad numeric frame ids to 6."""
    text = str(image_id).strip().replace("\\", "/")
    seq, _, frame = text.rpartition("/")
    if frame.isdigit():
        frame = f"{int(frame):06d}"
    return f"{seq}/{frame}" if seq else frame


def _png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from a PNG header without decoding the image."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(24)
    except OSError:
        return None
    if len(head) == 24 and head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
        return struct.unpack(">II", head[16:24])
    return None


def _image_size(path: Path) -> tuple[int, int] | None:
    size = _png_size(path)
    if size is None and path.is_file():
        import cv2

        img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        if img is not None:
            size = (img.shape[1], img.shape[0])
    return size


def _read_mask(path: Path):
    """As the challenge's loader: IMREAD_ANYDEPTH keeps 16-bit masks 16-bit and reads a colour
    mask as greyscale (so its mask ids are the grey levels, whatever `mask_channel` says)."""
    import cv2

    mask = cv2.imread(str(path), cv2.IMREAD_ANYDEPTH)
    if mask is None:
        raise EdgecapError(f"{path}: cannot read mask image")
    return mask


def _mask_box(mask, mask_id: int, where: str) -> tuple[int, int, int, int]:
    import numpy as np

    ys, xs = np.nonzero(mask == mask_id)
    if not len(xs):
        raise EdgecapError(f"{where}: no 'bounding_box' and no pixel of mask_id {mask_id} in the mask")
    return int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())


def _number(value) -> bool:
    """A finite JSON number (json.load also accepts NaN and Infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _box(value, where: str) -> tuple[int, int, int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise EdgecapError(f"{where}: 'bounding_box' must be [left, top, right, bottom], got {value!r}")
    if not all(_number(v) for v in value):
        raise EdgecapError(f"{where}: 'bounding_box' must hold numbers, got {value!r}")
    left, top, right, bottom = (int(v) for v in value)  # int(), as the challenge's loader
    if right < left or bottom < top:
        raise EdgecapError(f"{where}: 'bounding_box' {value!r} has right < left or bottom < top")
    return left, top, right, bottom


def _find_rgb(seq_dir: Path, frame_id: str, meta: dict, images_root: Path | None) -> Path | None:
    names = [meta[k] for k in ("image_name", "rgb_name") if isinstance(meta.get(k), str)]
    stems = [frame_id] + ([f"{int(frame_id):06d}"] if frame_id.isdigit() else [])
    names += [s + suf for s in dict.fromkeys(stems) for suf in RGB_SUFFIXES]
    folders = [seq_dir] + ([images_root / seq_dir.name] if images_root else [])
    for folder in folders:
        for name in names:
            path = folder / name
            if path.is_file():
                return path
    return None


def read_labels(path: Path) -> dict:
    labels = read_json(path)
    if not isinstance(labels, dict):
        raise EdgecapError(f"{path}: expected an object of frame ids, got {type(labels).__name__}")
    return labels


def _frame_sort_key(key: str):
    return (0, int(key), key) if key.isdigit() else (1, 0, key)


class _FrameMask:
    """The frame's mask image, read on first use (box areas need it only for missing boxes)."""

    def __init__(self, path: Path | None):
        self.path, self._mask = path, None

    @property
    def present(self) -> bool:
        return self.path is not None and self.path.is_file()

    def get(self):
        if self._mask is None:
            self._mask = _read_mask(self.path)
        return self._mask


def _mask_id(inst: dict, where: str) -> int | None:
    mask_id = inst.get("mask_id")
    if mask_id is None or isinstance(mask_id, int):
        return mask_id
    try:
        return int(mask_id)
    except (TypeError, ValueError):
        raise EdgecapError(f"{where}: 'mask_id' must be an integer, got {mask_id!r}") from None


def _read_object(inst_id: str, inst: dict, cls: str, mask: _FrameMask, size: tuple[int, int], area: str,
                 where: str) -> ACVRObject:
    mask_id = _mask_id(inst, where)
    num_pixels = inst.get("num_pixels")
    if num_pixels is not None and not _number(num_pixels):
        raise EdgecapError(f"{where}: 'num_pixels' must be a count, got {num_pixels!r}")
    box_value = inst.get("bounding_box")
    if box_value is None or box_value == []:  # the challenge's loader then boxes the mask
        if mask_id is None or not mask.present:
            raise EdgecapError(f"{where}: no 'bounding_box', and no mask_id and mask to derive it from")
        box, box_source = _mask_box(mask.get(), mask_id, where), "mask-box"
    else:
        box, box_source = _box(box_value, where), "box"
    total = float(size[0] * size[1])
    pixels = None
    if num_pixels is not None and int(num_pixels) > 0:
        pixels, pixel_source = min(int(num_pixels) / total, 1.0), "num_pixels"
    elif area == "pixels" and mask_id is not None and mask.present:  # absent, 0 or negative: count
        pixels, pixel_source = min(float((mask.get() == mask_id).sum()) / total, 1.0), "mask"
    box_area = box_fraction(box, *size)
    if area == "pixels" and pixels is not None:
        fraction, source = pixels, pixel_source
    else:
        fraction, source = box_area, box_source
    return ACVRObject(inst_id, cls, inst["class"], box, fraction, source, mask_id, box_area, pixels)


def iter_sequence(seq_dir: str | Path, images_root: str | Path | None = None,
                  area: str = "box") -> Iterator[ACVRFrame]:
    """Frames of one sequence folder, in frame order; `area` is "box" or "pixels"."""
    check_area(area)
    seq_dir = Path(seq_dir)
    labels_path = seq_dir / "labels.json"
    labels = read_labels(labels_path)
    images_root = Path(images_root) if images_root else None
    for frame_id in sorted(labels, key=_frame_sort_key):
        entry = labels[frame_id]
        where = f"{labels_path}: frame {frame_id!r}"
        if not isinstance(entry, dict):
            raise EdgecapError(f"{where}: expected an object of instances, got {type(entry).__name__}")
        meta = entry.get("_metadata", {})
        if not isinstance(meta, dict):
            raise EdgecapError(f"{where}: '_metadata' must be an object")
        mask_path = None
        if meta.get("mask_name") is not None:
            mask_path = seq_dir / str(meta["mask_name"])
        rgb_path = _find_rgb(seq_dir, frame_id, meta, images_root)
        size = None
        if isinstance(meta.get("width"), int) and isinstance(meta.get("height"), int):
            size = (meta["width"], meta["height"])
        if size is None and mask_path is not None:
            size = _image_size(mask_path)
        if size is None and rgb_path is not None:
            size = _image_size(rgb_path)
        mask = _FrameMask(mask_path)
        objects, unlisted = [], []
        for inst_id in sorted(k for k in entry if not k.startswith("_")):
            inst = entry[inst_id]
            iwhere = f"{where}, instance {inst_id!r}"
            if not isinstance(inst, dict):
                raise EdgecapError(f"{iwhere}: expected an object, got {type(inst).__name__}")
            if not isinstance(inst.get("class"), str) or not inst["class"].strip():
                raise EdgecapError(f"{iwhere}: missing 'class' name")
            cls = challenge_class(inst["class"])
            if cls is None:
                unlisted.append(inst["class"])
                continue
            if size is None:
                raise EdgecapError(
                    f"{where}: image size unknown (no readable mask {mask_path}, no RGB frame, "
                    "no _metadata width/height)"
                )
            objects.append(_read_object(inst_id, inst, cls, mask, size, area, iwhere))
        yield ACVRFrame(
            image_id=f"{seq_dir.name}/{frame_id}", sequence=seq_dir.name, frame_id=frame_id,
            rgb_path=rgb_path, mask_path=mask_path,
            width=size[0] if size else None, height=size[1] if size else None, objects=objects,
            unlisted=unlisted, area_kind=area,
        )


def sequence_dirs(root: str | Path) -> list[Path]:
    """Sequence folders under root (those holding labels.json); root itself if it is one."""
    root = Path(root)
    if not root.is_dir():
        raise EdgecapError(f"{root}: ACVR directory not found")
    if (root / "labels.json").is_file():
        return [root]
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and (p / "labels.json").is_file())
    if not dirs:
        raise EdgecapError(f"{root}: no sequence folders with labels.json (expected ROOT/000000/labels.json)")
    return dirs


def load_sequences(root: str | Path, images_root: str | Path | None = None,
                   area: str = "box") -> Iterator[ACVRFrame]:
    """Every frame of every sequence under root, sequence by sequence, in frame order."""
    for seq_dir in sequence_dirs(root):
        yield from iter_sequence(seq_dir, images_root, area)


def load_ground_truth(root: str | Path, images_root: str | Path | None = None,
                      area: str = "box") -> dict[str, dict[str, float]]:
    """{normalised image id: {class: largest area fraction}} for coverage and CHAIR."""
    return {normalize_image_id(f.image_id): f.class_areas() for f in load_sequences(root, images_root, area)}
