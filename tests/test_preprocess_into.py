"""The runtime preprocesses straight into its batch buffer (contract.preprocess.preprocess, out=):
the values must be exactly those of the plain formula, whatever the geometry or channel order."""

import cv2
import numpy as np
import pytest

from edgecap.contract.preprocess import preprocess, preprocess_as


def _formula(image_bgr, size, mean, std, channel_order):
    """The textbook steps, one array each: resize, channels, scale, normalise, channels first."""
    image = cv2.resize(image_bgr, (size, size), interpolation=cv2.INTER_LINEAR)
    if channel_order == "RGB":
        image = image[:, :, ::-1]
    x = image.astype(np.float32) / 255.0
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


@pytest.mark.parametrize("shape, order", [((480, 640, 3), "RGB"), ((300, 200, 3), "BGR"), ((64, 64, 3), "RGB")])
def test_writing_into_a_batch_row_gives_the_formulas_values_exactly(shape, order):
    image = np.random.default_rng(3).integers(0, 256, shape, dtype=np.uint8)
    settings = {"size": 64, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "channel_order": order}
    batch = np.full((3, 3, 64, 64), 7.0, np.float32)
    got = preprocess_as(image, settings, out=batch[1])
    want = _formula(image, 64, settings["mean"], settings["std"], order)
    assert got is not None and np.shares_memory(got, batch) and np.array_equal(batch[1], want)
    assert (batch[0] == 7.0).all() and (batch[2] == 7.0).all()  # the other rows untouched
    alone = preprocess(image, 64, settings["mean"], settings["std"], channel_order=order)
    assert alone.flags.c_contiguous and np.array_equal(alone, want)
