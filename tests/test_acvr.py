"""ACVR loader on small sequences written in the challenge's on-disk layout."""

import json

import cv2
import numpy as np
import pytest

from edgecap.data.acvr import load_ground_truth, load_sequences, normalize_image_id
from edgecap.errors import EdgecapError

W, H = 40, 20  # 800 pixels


def write_sequence(root, name, labels, masks=None, rgb=True):
    seq = root / name
    seq.mkdir(parents=True)
    (seq / "labels.json").write_text(json.dumps(labels))
    for fname, arr in (masks or {}).items():
        cv2.imwrite(str(seq / fname), arr)
    if rgb:
        for frame_id in labels:
            cv2.imwrite(str(seq / f"{frame_id}.png"), np.zeros((H, W, 3), np.uint8))
    return seq


@pytest.fixture
def acvr(tmp_path):
    mask8 = np.zeros((H, W), np.uint8)
    mask8[0:10, 0:8] = 3            # 80 px -> 0.10
    mask16 = np.zeros((H, W), np.uint16)
    mask16[:, :] = 0
    mask16[0:4, 0:10] = 1000        # 40 px -> 0.05, a value only 16 bit can hold
    write_sequence(tmp_path, "000000", {
        "000000": {"_metadata": {"mask_name": "0.png"},
                   "1": {"class": "TVMonitor", "mask_id": 3, "bounding_box": [0, 0, 7, 9]},
                   "2": {"class": "cup", "mask_id": 9, "bounding_box": [10, 10, 11, 11], "num_pixels": 8},
                   "3": {"class": "cup", "mask_id": 7, "bounding_box": [20, 0, 29, 9], "num_pixels": 100}},
        "000001": {"_metadata": {"mask_name": "1.png"},
                   "5": {"class": "sofa", "mask_id": 1000, "bounding_box": [0, 0, 9, 3]}},
    }, masks={"0.png": mask8, "1.png": mask16})
    write_sequence(tmp_path, "000001", {
        "2": {"_metadata": {"mask_name": "missing.png"},
              "1": {"class": "diningtable", "mask_id": 1, "bounding_box": [0, 0, 19, 9]},
              "2": {"class": "teddy bear", "mask_id": 2, "bounding_box": [0, 0, 0, 0], "num_pixels": 8},
              "3": {"class": "background", "mask_id": 0, "bounding_box": [0, 0, 39, 19]}},
        "3": {},
    }, masks={})
    return tmp_path


def test_frames_classes_and_areas(acvr):
    frames = {f.image_id: f for f in load_sequences(acvr)}
    assert list(frames) == ["000000/000000", "000000/000001", "000001/2", "000001/3"]
    f0 = frames["000000/000000"]
    assert (f0.width, f0.height) == (W, H) and f0.area_kind == "box"
    assert f0.rgb_path.name == "000000.png"
    by_id = {o.instance_id: o for o in f0.objects}
    assert by_id["1"].cls == "television" and by_id["1"].raw_class == "TVMonitor"
    # SMArT thresholds the area of the bounding box (inclusive pixel coordinates)
    assert by_id["1"].area == pytest.approx(80 / 800) and by_id["1"].area_source == "box"
    assert by_id["2"].area == pytest.approx(4 / 800)
    assert by_id["3"].area == pytest.approx(100 / 800)
    assert by_id["1"].box == (0, 0, 7, 9)
    # the largest instance of a class is the class's area
    assert f0.class_areas() == pytest.approx({"television": 0.1, "cup": 0.125})


def test_pixel_areas_from_num_pixels_or_the_mask(acvr):
    frames = {f.image_id: f for f in load_sequences(acvr, area="pixels")}
    by_id = {o.instance_id: o for o in frames["000000/000000"].objects}
    assert by_id["1"].area == pytest.approx(80 / 800) and by_id["1"].area_source == "mask"
    assert by_id["2"].area == pytest.approx(8 / 800) and by_id["2"].area_source == "num_pixels"
    assert frames["000000/000000"].area_kind == "pixels"
    # no mask file: the box stands in for the pixel count
    (table,) = frames["000001/2"].foreground
    assert table.area_source == "box" and table.area == pytest.approx(200 / 800)
    with pytest.raises(EdgecapError, match="area 'mask': expected one of box, pixels"):
        list(load_sequences(acvr, area="mask"))


def test_sixteen_bit_mask(acvr):
    f1 = [f for f in load_sequences(acvr, area="pixels") if f.image_id == "000000/000001"][0]
    assert f1.objects[0].cls == "couch"
    assert f1.objects[0].area == pytest.approx(40 / 800)
    assert f1.objects[0].area_source == "mask"


def test_classes_follow_the_challenge_list_unlisted_dropped_background_kept(acvr):
    """As the challenge's loader: names outside its class list and synonyms are dropped, its
    `none` (background) instances are kept; coverage reads only the foreground."""
    frames = {f.image_id: f for f in load_sequences(acvr)}
    f2 = frames["000001/2"]
    by_id = {o.instance_id: o for o in f2.objects}
    assert set(by_id) == {"1", "3"} and f2.unlisted == ["teddy bear"]
    assert by_id["1"].cls == "dining table" and by_id["1"].known
    assert by_id["1"].area == pytest.approx(200 / 800)    # inclusive box 20 x 10
    assert by_id["3"].cls == "none" and by_id["3"].raw_class == "background" and not by_id["3"].known
    assert [o.instance_id for o in f2.foreground] == ["1"]
    assert f2.class_areas() == pytest.approx({"dining table": 0.25})
    assert frames["000001/3"].objects == []


def test_class_names_are_matched_as_the_challenge_does(tmp_path):
    """Lower-cased, nothing else; its synonyms (stool -> chair, computer monitor -> television)
    apply, edgecap's caption-side aliases (fridge) do not."""
    boxes = {"bounding_box": [0, 0, 1, 1]}
    names = {"1": "Stool", "2": "computer monitor", "3": "fridge", "4": "potted_plant", "5": "BG",
             "6": "Person", "7": " cup"}
    write_sequence(tmp_path, "000000", {"000000": {"_metadata": {"width": W, "height": H},
                                                   **{k: {"class": v, **boxes} for k, v in names.items()}}})
    (frame,) = load_sequences(tmp_path)
    assert {o.instance_id: o.cls for o in frame.objects} == {"1": "chair", "2": "television", "5": "none",
                                                             "6": "person"}
    assert frame.unlisted == ["fridge", "potted_plant", " cup"]


def test_ground_truth_ids_are_normalised(acvr):
    gt = load_ground_truth(acvr)
    assert "000001/000002" in gt and gt["000001/000003"] == {}
    assert normalize_image_id("000001/2") == normalize_image_id("000001/000002")


def test_zero_num_pixels_is_recounted_from_the_mask(tmp_path):
    """The challenge's loader uses num_pixels only when > 0 and otherwise counts the mask."""
    mask = np.zeros((H, W), np.uint8)
    mask[0:5, 0:6] = 4          # 30 px
    write_sequence(tmp_path, "000000", {
        "000000": {"_metadata": {"mask_name": "m.png"},
                   "1": {"class": "cup", "mask_id": 4, "bounding_box": [0, 0, 5, 4], "num_pixels": 0},
                   "2": {"class": "cup", "mask_id": 4, "bounding_box": [0, 0, 5, 4], "num_pixels": -1}}},
        masks={"m.png": mask})
    (frame,) = load_sequences(tmp_path, area="pixels")
    assert [(o.area, o.area_source) for o in frame.objects] == [(pytest.approx(30 / 800), "mask")] * 2


def test_three_channel_mask_is_read_as_greyscale_like_the_challenge(tmp_path):
    """cv2.IMREAD_ANYDEPTH turns a colour mask into grey levels and `mask_channel` is ignored,
    as in the challenge's loader: a mask drawn in equal channels keeps its ids, one drawn in a
    single channel does not."""
    mask = np.zeros((H, W, 3), np.uint8)
    mask[0:2, 0:10] = 5         # all channels: grey 5, 20 px
    mask[5:13, 0:10, 2] = 5     # red only (BGR): grey round(0.299 * 5) = 1, 80 px
    write_sequence(tmp_path, "000000", {
        "000000": {"_metadata": {"mask_name": "m.png", "mask_channel": 2},
                   "1": {"class": "book", "mask_id": 5, "bounding_box": [0, 0, 9, 1]},
                   "2": {"class": "cup", "mask_id": 1, "bounding_box": [0, 5, 9, 12]}}},
        masks={"m.png": mask})
    (frame,) = load_sequences(tmp_path, area="pixels")
    assert [o.area for o in frame.objects] == [pytest.approx(20 / 800), pytest.approx(80 / 800)]


def test_boxes_truncate_like_the_challenge_and_come_from_the_mask_when_absent(tmp_path):
    mask = np.zeros((H, W), np.uint8)
    mask[3:7, 10:15] = 2        # box [10, 3, 14, 6]
    write_sequence(tmp_path, "000000", {
        "000000": {"_metadata": {"mask_name": "m.png"},
                   "1": {"class": "cup", "mask_id": 2, "bounding_box": [0.9, 0.2, 3.7, 1.99]},
                   "2": {"class": "cup", "mask_id": 2},
                   "3": {"class": "cup", "mask_id": 2, "bounding_box": []}}},
        masks={"m.png": mask})
    (frame,) = load_sequences(tmp_path)
    one, two, three = frame.objects
    assert one.box == (0, 0, 3, 1) and one.area == pytest.approx(8 / 800)
    assert two.box == three.box == (10, 3, 14, 6) and two.area_source == "mask-box"
    assert two.area == pytest.approx(20 / 800)


@pytest.mark.parametrize("labels, message", [
    ({"000000": {"1": {"mask_id": 1, "bounding_box": [0, 0, 1, 1]}}}, r"frame '000000', instance '1': missing 'class'"),
    ({"000000": {"1": {"class": "cup", "bounding_box": [0, 0, 1]}}}, r"instance '1': 'bounding_box' must be"),
    ({"000000": {"1": {"class": "cup", "bounding_box": [5, 0, 1, 1]}}}, r"right < left"),
    ({"000000": {"1": {"class": "cup", "bounding_box": [0, 0, 1, 1], "mask_id": "x"}}}, r"'mask_id' must be an integer"),
    ({"000000": {"1": {"class": "cup", "bounding_box": [0, "a", 1, 1]}}}, r"'bounding_box' must hold numbers"),
    ({"000000": {"1": {"class": "cup", "bounding_box": [0, 0, 1, 1], "num_pixels": "9"}}}, r"'num_pixels' must be a count"),
    ({"000000": {"1": {"class": "cup", "bounding_box": [0, 0, 1, float("inf")]}}}, r"'bounding_box' must hold numbers"),
    ({"000000": {"1": {"class": "cup", "mask_id": 1}}}, r"no 'bounding_box', and no mask_id and mask to derive it"),
    ({"000000": ["cup"]}, r"frame '000000': expected an object"),
    ([1, 2], r"expected an object of frame ids"),
])
def test_malformed_labels_name_file_and_key(tmp_path, labels, message):
    seq = write_sequence(tmp_path, "000000", {"000000": {}})
    (seq / "labels.json").write_text(json.dumps(labels))
    with pytest.raises(EdgecapError, match=message) as err:
        list(load_sequences(tmp_path))
    assert "labels.json" in str(err.value) and "\n" not in str(err.value)


def test_broken_json_and_missing_root(tmp_path):
    seq = write_sequence(tmp_path, "000000", {"000000": {}})
    (seq / "labels.json").write_bytes(b'{"000000": ')
    with pytest.raises(EdgecapError, match="invalid JSON at line 1"):
        list(load_sequences(tmp_path))
    (seq / "labels.json").write_bytes(b'{"\xff": {}}')
    with pytest.raises(EdgecapError, match="not UTF-8"):
        list(load_sequences(tmp_path))
    with pytest.raises(EdgecapError, match="ACVR directory not found"):
        list(load_sequences(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EdgecapError, match="no sequence folders"):
        list(load_sequences(tmp_path / "empty"))
