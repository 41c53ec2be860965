"""Image preprocessing as the bundle manifest (or a model's VisualConfig) says.

Training, feature extraction, export and the runtime all call this one function, so a resize
filter, crop or channel order can never differ between them.

Two geometries:
- crop "none": the whole frame is resized (squashed) to size x size. Nothing in view is cut
  off, which is what a robot that must name every object wants; aspect ratio is lost.
- crop "center": the shorter side is resized to `resize_size` (the longer one keeps the aspect
  ratio, truncated to an integer as torchvision's `Resize(int)` does), then the centre
  size x size is cut out (offsets rounded as torchvision's `center_crop`). This is how
  open_clip (`resize_size == size`) and torchvision's ImageNet weights (e.g. 232 -> 224)
  prepared their training images, so features match what the weights saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

RESIZE_FILTERS = ("nearest", "bilinear", "bicubic", "area", "lanczos")
CROPS = ("none", "center")


def _cv2_filter(name: str) -> int:
    import cv2

    table = {
        "nearest": cv2.INTER_NEAREST,
        "bilinear": cv2.INTER_LINEAR,
        "bicubic": cv2.INTER_CUBIC,
        "area": cv2.INTER_AREA,
        "lanczos": cv2.INTER_LANCZOS4,
    }
    if name not in table:
        raise ValueError(f"resize filter {name!r}, expected one of {', '.join(RESIZE_FILTERS)}")
    return table[name]


def resized_shape(height: int, width: int, short: int) -> tuple[int, int]:
    """(h, w) after resizing the shorter side to `short` (torchvision's integer rule)."""
    if height <= width:
        return short, int(short * width / height)
    return int(short * height / width), short


def _center_crop(image: np.ndarray, size: int) -> np.ndarray:
    h, w = image.shape[:2]
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return image[top:top + size, left:left + size]


def preprocess(
    image_bgr: np.ndarray,
    size: int,
    mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225),
    resize: str = "bilinear",
    channel_order: str = "RGB",
    crop: str = "none",
    resize_size: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """uint8 HxWx3 BGR (OpenCV's order) -> float32 [3, size, size], scaled to [0, 1],
    normalised by mean/std given in `channel_order`. `crop`/`resize_size`: see the module doc
    (resize_size 0 means `size`). `out`: write into this float32 [3, size, size] array (e.g. a
    row of a reused batch buffer) instead of a new one; the arithmetic is the same, in the same
    order, in place, so no intermediate array (~0.6 MB of float32 each at 224 px) is made."""
    import cv2

    if image_bgr.ndim != 3 or image_bgr.shape[2] != 3:
        raise ValueError(f"image has shape {image_bgr.shape}, expected HxWx3")
    if crop == "center":
        short = int(resize_size or size)
        if short < size:
            raise ValueError(f"resize_size {short} is smaller than the crop size {size}")
        h, w = resized_shape(*image_bgr.shape[:2], short)
        if (h, w) != image_bgr.shape[:2]:
            image_bgr = cv2.resize(image_bgr, (w, h), interpolation=_cv2_filter(resize))
        image_bgr = _center_crop(image_bgr, size)
    elif crop != "none":
        raise ValueError(f"crop {crop!r}, expected one of {', '.join(CROPS)}")
    elif image_bgr.shape[:2] != (size, size):
        image_bgr = cv2.resize(image_bgr, (size, size), interpolation=_cv2_filter(resize))
    if channel_order == "RGB":
        image = image_bgr[:, :, ::-1]
    elif channel_order == "BGR":
        image = image_bgr
    else:
        raise ValueError(f"channel_order {channel_order!r}, expected 'RGB' or 'BGR'")
    if out is None:
        out = np.empty((3, size, size), np.float32)
    np.copyto(out, image.transpose(2, 0, 1), casting="unsafe")  # uint8 -> float32, channels first
    out /= np.float32(255.0)
    out -= np.asarray(mean, np.float32)[:, None, None]
    out /= np.asarray(std, np.float32)[:, None, None]
    return out


@dataclass(frozen=True)
class Preprocessing:
    """How images are prepared for a model: the one description a model's VisualConfig, a set
    of pretrained weights, the bundle manifest and the runtime share. Its dict form
    (`to_dict`) is the manifest's `preprocessing` record and the HDF5 feature files' attribute."""

    size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resize: str = "bilinear"  # OpenCV filter name
    channel_order: str = "RGB"
    crop: str = "none"  # "none": squash to size x size; "center": shorter side -> resize_size, centre crop
    resize_size: int = 0  # crop "center": shorter side before cropping (0 = size)

    @classmethod
    def from_mapping(cls, settings: Mapping) -> Preprocessing:
        """The dict form (size, mean, std required; the others optional) -> Preprocessing."""
        return cls(int(settings["size"]), tuple(float(m) for m in settings["mean"]),
                   tuple(float(s) for s in settings["std"]), settings.get("resize", "bilinear"),
                   settings.get("channel_order", "RGB"), settings.get("crop", "none"),
                   int(settings.get("resize_size", 0) or 0))

    def to_dict(self) -> dict:
        return {"size": self.size, "resize": self.resize, "mean": list(self.mean), "std": list(self.std),
                "channel_order": self.channel_order, "crop": self.crop, "resize_size": self.resize_size or self.size}

    def visual_overrides(self) -> dict:
        """The `visual.*` config fields that carry this preprocessing."""
        return {"image_size": self.size, "mean": tuple(self.mean), "std": tuple(self.std), "resize": self.resize,
                "channel_order": self.channel_order, "crop": self.crop, "resize_size": self.resize_size or self.size}

    def __call__(self, image_bgr: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The image as the model takes it; written into `out` ([3, size, size] float32) when given."""
        return preprocess(image_bgr, self.size, self.mean, self.std, self.resize, self.channel_order,
                          self.crop, self.resize_size, out=out)


def preprocess_as(image_bgr: np.ndarray, settings: Mapping | Preprocessing, out: np.ndarray | None = None) -> np.ndarray:
    """`preprocess` as a `Preprocessing` or its dict form (the manifest's record) says; into `out` when given."""
    pre = settings if isinstance(settings, Preprocessing) else Preprocessing.from_mapping(settings)
    return pre(image_bgr, out=out)
