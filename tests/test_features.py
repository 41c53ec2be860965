"""HDF5 features in the M2 layout, and `edgecap features extract` (tiny open_clip ViT)."""

import json
import re

import numpy as np
import pytest
import torch

from edgecap.data.features import FeatureStore, FeatureWriter
from edgecap.errors import EdgecapError

h5py = pytest.importorskip("h5py")

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16},
    "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
}


def write_m2_file(path, entries):
    """Features as the M2 code's coco_detections.hdf5 stores them: '<id>_features' [n, D]."""
    with h5py.File(path, "w") as f:
        for image_id, feats in entries.items():
            f.create_dataset(f"{image_id}_features", data=feats)


def test_store_pads_truncates_and_masks(tmp_path):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(3, 8)), rng.normal(size=(7, 8))
    path = tmp_path / "m2.h5"
    write_m2_file(path, {37209: a, 42: b})
    store = FeatureStore(path, n_regions=5)
    feats, mask = store.get(37209)
    assert feats.dtype == np.float32 and feats.shape == (5, 8)
    assert np.allclose(feats[:3], a) and not feats[3:].any()
    assert mask.tolist() == [True, True, True, False, False]
    feats, mask = store.get("42")
    assert np.allclose(feats, b[:5]) and mask.all()
    batch, masks = store.get_batch([42, 37209])
    assert batch.shape == (2, 5, 8) and masks.sum(1).tolist() == [5, 3]
    assert sorted(store.ids()) == ["37209", "42"] and 42 in store and 7 not in store
    # Unpadded access keeps each entry's length; M2-imported models see the padding as rows.
    assert FeatureStore(path).get(37209)[0].shape == (3, 8)
    assert FeatureStore(path, n_regions=5, mask_padding=False).get(37209)[1].all()


def test_missing_key_is_an_error_never_random_features(tmp_path):
    path = tmp_path / "m2.h5"
    write_m2_file(path, {1: np.ones((2, 4))})
    with pytest.raises(EdgecapError) as info:
        FeatureStore(path, n_regions=3).get(391895)
    assert "'391895_features'" in str(info.value) and str(path) in str(info.value)
    with pytest.raises(EdgecapError, match="does not exist"):
        FeatureStore(tmp_path / "nope.h5")
    (tmp_path / "junk.h5").write_text("not hdf5")
    with pytest.raises(EdgecapError, match="not a readable HDF5 file"):
        FeatureStore(tmp_path / "junk.h5").get(1)


def test_writer_refuses_other_provenance_and_redoes_half_written_entries(tmp_path):
    path = tmp_path / "f.h5"
    with FeatureWriter(path, {"backbone": "ViT-B-32", "preprocessing": {"size": 224}}) as w:
        w.write(1, np.ones((4, 3)))
        w.write(2, np.ones((4, 3)))
    with pytest.raises(EdgecapError, match="was written with backbone='ViT-B-32', this run has 'ViT-L-14'"):
        FeatureWriter(path, {"backbone": "ViT-L-14"})
    with h5py.File(path, "a") as f:  # what a kill between create and the `complete` flag leaves
        del f["2_features"].attrs["complete"]
    with pytest.raises(EdgecapError, match="'2_features' was left half-written"):
        FeatureStore(path).get(2)
    with FeatureWriter(path, {"backbone": "ViT-B-32"}) as w:
        assert w.done_ids() == {"1"}
    assert FeatureStore(path).attrs["preprocessing"] == {"size": 224}


# --- edgecap features extract ------------------------------------------------------------------

@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    open_clip = pytest.importorskip("open_clip")
    root = tmp_path_factory.mktemp("clip")
    config = root / "edgecap-features-vit.json"
    config.write_text(json.dumps(TINY))
    open_clip.add_model_config(config)
    torch.manual_seed(0)
    model = open_clip.create_model(config.stem, pretrained=None, pretrained_image=False, pretrained_text=False)
    weights = root / "clip.pt"
    torch.save(model.state_dict(), weights)
    return str(config), weights


@pytest.fixture
def dataset(tmp_path):
    """Karpathy split file + images laid out as IMAGES/<filepath>/<filename>."""
    import cv2

    rng = np.random.default_rng(1)
    images, entries = tmp_path / "images", []
    for i in range(7):
        split = "train" if i < 5 else "val"
        folder = "train2014" if split == "train" else "val2014"
        name = f"COCO_{folder}_{i + 100:012d}.png"
        (images / folder).mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(images / folder / name), rng.integers(0, 255, size=(48 + 8 * i, 80, 3), dtype=np.uint8))
        entries.append({"filepath": folder, "filename": name, "cocoid": i + 100, "imgid": i, "split": split,
                        "sentences": [{"tokens": ["a", "cup"], "raw": "A cup."}]})
    split_file = tmp_path / "dataset_coco.json"
    split_file.write_text(json.dumps({"images": entries, "dataset": "coco"}))
    return images, split_file


def extract_args(backbone, dataset, out, *extra):
    config, weights = backbone
    images, split_file = dataset
    return ["features", "extract", "--backbone", config, "--weights", weights, "--images", images,
            "--split-file", split_file, "--out", out, "--batch-size", 3, *extra]


def test_extract_writes_the_backbone_tokens_for_every_image(backbone, dataset, tmp_path, run_cli):
    import cv2

    from edgecap.contract.preprocess import preprocess
    from edgecap.models.frontends import build_frontend

    out = tmp_path / "feats.h5"
    code, stdout, stderr = run_cli(*extract_args(backbone, dataset, out))
    assert code == 0, stderr
    assert "7 images written, 0 already present; 16 tokens x 64" in stdout
    store = FeatureStore(out, n_regions=16)
    assert sorted(store.ids()) == [str(i) for i in range(100, 107)]
    visual = build_frontend(backbone[0], weights=str(backbone[1]))
    prep = visual.cfg.visual
    image = cv2.imread(str(dataset[0] / "val2014" / "COCO_val2014_000000000106.png"))  # 96 x 80
    # open_clip's geometry: shorter side to 64 (bicubic), centre 64 x 64 crop
    pixels = preprocess(image, 64, prep.mean, prep.std, "bicubic", crop="center", resize_size=64)
    expected = visual(torch.from_numpy(pixels[None]))[0][0]
    feats, mask = store.get(106)
    assert mask.all() and np.allclose(feats, expected.numpy(), atol=1e-5)
    assert store.attrs["backbone"] == "edgecap-features-vit" and store.attrs["n_regions"] == 16
    store.close()
    code, stdout, stderr = run_cli(*extract_args(backbone, dataset, out))
    assert code == 0 and "0 images written, 7 already present" in stdout, stderr


def test_interrupted_extraction_continues(backbone, dataset, tmp_path, run_cli, monkeypatch):
    import edgecap.data.features_command as command

    real_load, calls = command._load_image, []

    def flaky(item, prep):  # the 5th image read fails: the first batch of 3 is already on disk
        calls.append(item.image_id)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_load(item, prep)

    monkeypatch.setattr(command, "_load_image", flaky)
    out = tmp_path / "feats.h5"
    code, _, stderr = run_cli(*extract_args(backbone, dataset, out))
    assert code == 130 and "interrupted" in stderr
    assert len(FeatureStore(out)) == 3
    monkeypatch.setattr(command, "_load_image", real_load)
    code, stdout, _ = run_cli(*extract_args(backbone, dataset, out))
    assert code == 0 and "4 images written, 3 already present" in stdout
    assert len(FeatureStore(out)) == 7


def test_extract_bad_inputs(backbone, dataset, tmp_path, run_cli):
    images, split_file = dataset
    victim = images / "train2014" / "COCO_train2014_000000000102.png"
    victim.unlink()
    code, _, stderr = run_cli(*extract_args(backbone, dataset, tmp_path / "f.h5"))
    assert code == 1 and f"image file {victim} does not exist" in stderr
    code, _, stderr = run_cli(*extract_args(backbone, dataset, tmp_path / "f.h5", "--splits", "test"))
    assert code == 1 and "lists no images in splits ['test']" in stderr
    code, stdout, _ = run_cli(*extract_args(backbone, dataset, tmp_path / "val.h5", "--splits", "val"))
    assert code == 0 and "2 images written" in stdout
    config, _ = backbone
    code, _, stderr = run_cli("features", "extract", "--backbone", config, "--weights", tmp_path / "none.pt",
                              "--images", images, "--split-file", split_file, "--out", tmp_path / "x.h5",
                              "--splits", "val")
    assert code == 1 and f"{tmp_path / 'none.pt'} does not exist" in stderr


def test_extract_never_appends_to_a_features_file_it_did_not_write(backbone, dataset, tmp_path, run_cli):
    """The official M2 features file (coco_detections.hdf5, written with h5py by its authors'
    tools) given as --out is left byte for byte as it was."""
    import h5py

    theirs = tmp_path / "coco_detections.hdf5"
    with h5py.File(theirs, "w") as f:
        f.create_dataset("391895_features", data=np.ones((50, 2048), np.float32))
    before = theirs.read_bytes()
    code, _, stderr = run_cli(*extract_args(backbone, dataset, theirs, "--splits", "val"))
    assert code == 1 and stderr.count("\n") == 1
    assert f"features file {theirs} was not written by edgecap (it holds 391895_features); not appending to it" in stderr
    assert theirs.read_bytes() == before


def test_splits_train_takes_restval_like_training(backbone, dataset, tmp_path, run_cli):
    """dataset_coco.json as Karpathy ships it: 30k COCO-val images are in "restval", which
    training reads as train; features for --splits train must cover them."""
    from edgecap.data.karpathy import load_karpathy

    images, split_file = dataset
    doc = json.loads(split_file.read_text())
    doc["images"][3]["split"] = doc["images"][4]["split"] = "restval"
    split_file.write_text(json.dumps(doc))
    out = tmp_path / "train.h5"
    code, stdout, stderr = run_cli(*extract_args(backbone, dataset, out, "--splits", "train"))
    assert code == 0 and "5 images written" in stdout, stderr
    train = load_karpathy(split_file)["train"]
    assert sorted(FeatureStore(out).ids()) == sorted(im.image_id for im in train)
    code, stdout, _ = run_cli(*extract_args(backbone, dataset, tmp_path / "rv.h5", "--splits", "restval"))
    assert code == 0 and "2 images written" in stdout
    code, _, stderr = run_cli(*extract_args(backbone, dataset, tmp_path / "x.h5", "--splits", "train,tset"))
    assert code == 1 and "--splits tset: not a Karpathy split; expected train, restval, val, test" in stderr


def test_out_that_is_not_hdf5_is_refused_untouched(backbone, dataset, tmp_path, run_cli):
    """--out naming a user's file by mistake: refused, and not with advice to delete it."""
    mine = tmp_path / "notes.json"
    mine.write_text('{"images": []}')
    code, _, stderr = run_cli(*extract_args(backbone, dataset, mine, "--splits", "val"))
    assert code == 1 and stderr.count("\n") == 1
    assert f"features file {mine} exists and is not an HDF5 file; not writing over it" in stderr
    assert mine.read_text() == '{"images": []}'
    # a folder, or a path through a file: one line, and no advice to delete anything
    folder = tmp_path / "runs"
    (folder / "keep").mkdir(parents=True)
    code, _, stderr = run_cli(*extract_args(backbone, dataset, folder, "--splits", "val"))
    assert code == 1 and stderr.strip().endswith(f"features file {folder} is a directory; --out names an "
                                                 "HDF5 file (.h5)")
    code, _, stderr = run_cli(*extract_args(backbone, dataset, mine / "f.h5", "--splits", "val"))
    assert code == 1 and stderr.count("\n") == 1 and f"features file {mine / 'f.h5'}: cannot create {mine}" in stderr
    assert (folder / "keep").is_dir() and mine.read_text() == '{"images": []}'


def test_extract_finds_coco_2017_images_under_their_new_names(backbone, dataset, tmp_path, run_cli):
    """COCO's site offers the 2017 release: the same pictures re-split into train2017/ and
    val2017/ and renamed to their zero-padded ids, while dataset_coco.json keeps the 2014
    names. Extraction must find them (a 2014 val image may sit in train2017/)."""
    import shutil

    import cv2

    images, split_file = dataset
    for i in range(100, 107):
        folder = "val2017" if i == 106 else "train2017"
        old = next(images.glob(f"*/COCO_*_{i:012d}.png"))
        (images / folder).mkdir(exist_ok=True)
        cv2.imwrite(str(images / folder / f"{i:012d}.jpg"), cv2.imread(str(old)))
    shutil.rmtree(images / "train2014"), shutil.rmtree(images / "val2014")
    out = tmp_path / "feats.h5"
    code, stdout, stderr = run_cli(*extract_args(backbone, dataset, out))
    assert code == 0, stderr
    assert "7 images written" in stdout
    with FeatureStore(out) as store:
        assert sorted(store.ids()) == [str(i) for i in range(100, 107)]


def test_split_file_saved_with_a_byte_order_mark_or_bad_bytes(dataset):
    """A dataset_coco.json saved again by Notepad / PowerShell (UTF-8 with a BOM) is read; one
    that is not UTF-8, or holds no 'images' list, is one line naming the split file."""
    from edgecap.data.features_command import read_split_images

    images, split_file = dataset
    split_file.write_bytes(b"\xef\xbb\xbf" + split_file.read_bytes())
    assert len(read_split_images(split_file, images)) == 7
    split_file.write_bytes(split_file.read_bytes().replace(b"A cup.", b"A caf\xe9.", 1))  # Latin-1 e-acute
    with pytest.raises(EdgecapError, match=rf"^split file {re.escape(str(split_file))}: not UTF-8 text \(byte \d+\)$"):
        read_split_images(split_file, images)
    split_file.write_text('[{"images": []}]')
    with pytest.raises(EdgecapError, match="is not a Karpathy dataset_coco.json \\(no 'images' list\\)"):
        read_split_images(split_file, images)
