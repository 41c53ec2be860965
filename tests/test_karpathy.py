"""Karpathy dataset_coco.json loader: splits, restval folding, tokenisation, one-line errors."""

import json

import pytest

from edgecap.data.karpathy import load_karpathy
from edgecap.errors import EdgecapError


def entry(cocoid, split, captions=("A red mug.", "A mug on a table."), filepath="val2014", tokens=True):
    sentences = [{"raw": c, **({"tokens": c.rstrip(".").split()} if tokens else {})} for c in captions]
    return {"filepath": filepath, "filename": f"img_{cocoid}.jpg", "cocoid": cocoid, "split": split,
            "sentences": sentences}


def write(tmp_path, images, name="dataset_coco.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return path


def test_restval_is_folded_into_train_and_captions_are_tokenised(tmp_path):
    path = write(tmp_path, [entry(1, "train"), entry(2, "restval"), entry(3, "val"), entry(4, "test"),
                            entry(5, "restval", captions=("Two BANANAS, on a plate!",), tokens=False)])
    splits = load_karpathy(path)
    assert [im.image_id for im in splits.train] == ["1", "2", "5"]
    assert splits.counts() == {"train": 3, "val": 1, "test": 1}
    assert {im.split for im in splits.train} == {"train"}
    # tokens come from `tokens` (or `raw`), lower-cased with punctuation stripped
    assert splits.train[0].captions[0] == ("a", "red", "mug")
    assert splits.train[2].captions == (("two", "bananas", "on", "a", "plate"),)
    assert splits.val[0].path == "val2014/img_3.jpg"
    assert splits.val[0].caption_strings() == ["a red mug", "a mug on a table"]


def test_only_requested_splits_are_kept(tmp_path):
    path = write(tmp_path, [entry(1, "train"), entry(2, "test")])
    splits = load_karpathy(path, splits=("train", "val"))
    assert len(splits.train) == 1 and splits.test == []


def test_missing_image_is_named(tmp_path):
    root = tmp_path / "images"
    (root / "val2014").mkdir(parents=True)
    (root / "val2014" / "img_1.jpg").write_bytes(b"x")
    path = write(tmp_path, [entry(1, "train"), entry(2, "val")])
    with pytest.raises(EdgecapError, match=r"image 2: image file .*img_2\.jpg does not exist") as exc:
        load_karpathy(path, root)
    assert "\n" not in str(exc.value)
    # without an image folder (HDF5 features) nothing is checked on disk
    assert len(load_karpathy(path).val) == 1


def test_images_are_found_under_coco_2017_names(tmp_path):
    """The split file's own path first, then the file name in a flat folder, then COCO 2017's
    train2017/ or val2017/<12-digit id>.jpg; errors say every place looked in."""
    root = tmp_path / "images"
    for rel in ("val2014/img_1.jpg", "img_2.jpg", "train2017/000000000003.jpg", "val2017/000000000004.jpg"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    path = write(tmp_path, [entry(i, "train") for i in (1, 2, 3, 4)])
    found = load_karpathy(path, root).train
    assert [im.path for im in found] == ["val2014/img_1.jpg", "img_2.jpg", "train2017/000000000003.jpg",
                                         "val2017/000000000004.jpg"]
    path = write(tmp_path, [entry(5, "train")])
    with pytest.raises(EdgecapError, match=r"img_5\.jpg does not exist \(nor img_5\.jpg, "
                                           r"train2017/000000000005\.jpg, val2017/000000000005\.jpg"):
        load_karpathy(path, root)


def test_empty_caption_list_is_named(tmp_path):
    path = write(tmp_path, [entry(1, "train"), entry(7, "train", captions=())])
    with pytest.raises(EdgecapError, match=r"image 7: empty caption list"):
        load_karpathy(path)


def test_caption_without_words_is_named(tmp_path):
    path = write(tmp_path, [entry(8, "val", captions=("A cup.", "..."), tokens=False)])
    with pytest.raises(EdgecapError, match=r"image 8: sentences\[1\] is an empty caption"):
        load_karpathy(path)


@pytest.mark.parametrize("images, message", [
    ([entry(1, "holdout")], r"image 1: split 'holdout', expected train, val, test or restval"),
    ([entry(1, "train"), entry(1, "val")], r"image 1: cocoid listed twice"),
    ([{"cocoid": 3, "split": "train", "sentences": []}], r"images\[0\]: missing field 'filename'"),
])
def test_malformed_entries(tmp_path, images, message):
    with pytest.raises(EdgecapError, match=message):
        load_karpathy(write(tmp_path, images))


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(EdgecapError, match="does not exist"):
        load_karpathy(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(EdgecapError, match="invalid JSON at line 1: Expecting property name"):
        load_karpathy(bad)
    bad.write_text(json.dumps({"annotations": []}))
    with pytest.raises(EdgecapError, match="'images' list"):
        load_karpathy(bad)


def test_reads_the_synthetic_world(tmp_path):
    from edgecap.data.synth import generate_dataset

    generate_dataset(tmp_path / "w", 40, seed=2, size=32, sequences=0, video_frames=0, progress=False)
    splits = load_karpathy(tmp_path / "w" / "dataset_coco.json", tmp_path / "w" / "images")
    # synthetic split plan for 40 images: 2 val, 2 test, 4 restval (folded), 32 train
    assert splits.counts() == {"train": 36, "val": 2, "test": 2}
    assert all(len(im.captions) == 5 for im in splits.train)
