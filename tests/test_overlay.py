"""The annotated frame (--save-video, --show, the README frames): labels inside the frame, a
legend for the box colours, coverage at every threshold, and no empty band."""

import numpy as np
import pytest

from edgecap.runtime.camera import Frame
from edgecap.runtime.captioner import Caption
from edgecap.runtime.overlay import GREEN, GREY, PLATE, YELLOW, annotate, coverage_text, label_rect
from edgecap.runtime.records import Record
from edgecap.runtime.sources import KnownObject

COVERAGE = {">1%": 1 / 3, ">3%": 0.5, ">5%": 1.0, ">10%": None}


def _record(objects, caption="a laptop on a desk", coverage=COVERAGE, matches=None, size=64):
    image = np.full((size, size, 3), 200, np.uint8)
    return Record(Frame(image, 7, 0.0, 0.0, objects), Caption(caption, [5], beam=3), "x", 0.048,
                  coverage=coverage, matches=matches or [])


@pytest.mark.parametrize("box", [(0, 0, 30, 30), (40, 0, 64, 20), (60, 30, 64, 64), (-5, -3, 10, 10),
                                 (0, 60, 64, 64)])
def test_labels_stay_inside_the_frame(box):
    scale = 8  # 64 px -> 512 px
    left, top, right, bottom = label_rect(tuple(v * scale for v in box), "laptop ~computer 0.71", 512, 512)
    assert 0 <= left < right <= 512 and 0 <= top < bottom <= 512


def test_a_box_at_the_top_edge_gets_its_whole_label_on_a_plate_inside_it():
    out = annotate(_record([KnownObject("laptop", (0, 0, 40, 30), 0.3)]))
    left, top, right, bottom = label_rect((0, 0, 320, 240), "laptop", 512, 512)
    assert top >= 0 and left == 0
    plate = out[top + 1:bottom - 1, left + 1:right - 1]
    assert (plate == PLATE).all(axis=2).mean() > 0.5  # the dark plate behind the text
    assert (plate != PLATE).any(axis=2).sum() > 20  # and the label's text on it


def test_legend_and_every_threshold_are_in_the_band():
    objects = [KnownObject("laptop", (4, 4, 30, 30), 0.2), KnownObject("cup", (34, 34, 60, 60), 0.05),
               KnownObject("book", (40, 4, 60, 20), 0.02)]
    matches = [{"noun": "laptop", "class": "laptop", "profit": 1.0, "exact": True},
               {"noun": "mug", "class": "cup", "profit": 0.8, "exact": False}]
    out = annotate(_record(objects, matches=matches))
    band = out[512:]
    for color in (GREEN, YELLOW, GREY):  # the legend's swatches (and its words) in the box colours
        assert (band == color).all(axis=2).sum() >= 25, color
    assert coverage_text(COVERAGE) == "coverage  >1% 33%  >3% 50%  >5% 100%  >10% -"


def test_the_band_is_no_taller_than_its_lines():
    out = annotate(_record([KnownObject("laptop", (4, 4, 30, 30), 0.2)]))
    band = out[512:]
    # the last line (frame info and legend) sits at the bottom: no all-black strip under it
    rows_with_ink = np.nonzero(band.reshape(band.shape[0], -1).max(axis=1) > 0)[0]
    assert band.shape[0] - 1 - rows_with_ink.max() <= 10
    # and no empty line between the caption and the rest
    gaps = np.diff(rows_with_ink)
    assert gaps.max() <= 14


def test_video_frames_keep_one_size_whatever_the_caption():
    short = annotate(_record(None, "a cup"), caption_lines=2)
    long = annotate(_record(None, "a cup next to a laptop on a wooden desk beside a bottle and a book "
                                  "under a lamp in a kitchen with a plant"), caption_lines=2)
    assert short.shape == long.shape
