"""Image preprocessing as the bundle manifest (or a model's VisualConfig) says.

Training, export and the runtime all call this one function, so a resize filter or channel
order can never differ between them.
"""

from __future__ import annotations

import numpy as np

RESIZE_FILTERS = ("nearest", "bilinear", "bicubic", "area", "lanczos")


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


def preprocess(
    image_bgr: np.ndarray,
    size: int,
    mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225),
    resize: str = "bilinear",
    channel_order: str = "RGB",
) -> np.ndarray:
    """uint8 HxWx3 BGR (OpenCV's order) -> float32 [3, size, size], scaled to [0, 1],
    normalised by mean/std given in `channel_order`."""
    import cv2

    if image_bgr.ndim != 3 or image_bgr.shape[2] != 3:
        raise ValueError(f"image has shape {image_bgr.shape}, expected HxWx3")
    if image_bgr.shape[:2] != (size, size):
        image_bgr = cv2.resize(image_bgr, (size, size), interpolation=_cv2_filter(resize))
    if channel_order == "RGB":
        image = image_bgr[:, :, ::-1]
    elif channel_order == "BGR":
        image = image_bgr
    else:
        raise ValueError(f"channel_order {channel_order!r}, expected 'RGB' or 'BGR'")
    x = image.astype(np.float32) / 255.0
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def preprocess_batch(images_bgr, size: int, **kwargs) -> np.ndarray:
    return np.stack([preprocess(im, size, **kwargs) for im in images_bgr])
