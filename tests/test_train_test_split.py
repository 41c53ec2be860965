"""Evaluate what you trained on cached features (issue 30): `train --test` and `edgecap caption
--features FILE --split test` caption the test split in PyTorch, and the bundle exported from the
same checkpoint gets the same CIDEr-D on the same images.

The features file is written with h5py the way the official M2 code's coco_detections.hdf5 is
laid out: one float32 dataset `<image_id>_features` of [regions, D] per image, the region count
varying between images, no attributes."""

import json

import numpy as np
import pytest
from _train_tiny import TINY_MODEL

from edgecap.train.config import parse_config, to_toml
from edgecap.train.loop import Trainer

D, REGIONS = 16, 12


@pytest.fixture(scope="module")
def m2_features(world, tmp_path_factory):
    """coco_detections.hdf5-style features of the world's images: each image's pixels pooled
    over a grid (so similar scenes get similar features), a few rows fewer for some images."""
    import cv2
    import h5py

    doc = json.loads((world / "dataset_coco.json").read_text())
    path = tmp_path_factory.mktemp("m2") / "coco_detections.hdf5"
    with h5py.File(path, "w") as f:
        for i, im in enumerate(doc["images"]):
            bgr = cv2.imread(str(world / "images" / im["filepath"] / im["filename"])).astype(np.float32) / 255
            cells = cv2.resize(bgr, (4, 4), interpolation=cv2.INTER_AREA).reshape(16, 3)
            rows = np.concatenate([cells, np.tile(cells.mean(0), (16, 1)), np.zeros((16, D - 6))], 1)
            f.create_dataset(f"{im['cocoid']}_features", data=rows[: REGIONS - i % 3].astype(np.float32))
    return path


def _config(world, features, **run):
    model = {**TINY_MODEL, "visual": {"kind": "features"}, "d_in": D, "n_regions": REGIONS}
    return parse_config({
        "model": model,
        "data": {"karpathy": str(world / "dataset_coco.json"), "features": str(features), "batch_size": 4,
                 "min_count": 1, "val_batch_size": 8},
        "optim": {"lr": 0.05},
        "schedule": {"kind": "noam", "epochs": 2, "warmup": 5},
        "run": {"log_every": 1, "threads": 1, "seed": 0, "val_beam": 2, **run},
    }, source="features.toml")


def _bundle_captions(bundle_dir, features, ids):
    from edgecap.contract.beam import DecodeOptions
    from edgecap.data.features import FeatureStore
    from edgecap.runtime.session import Bundle

    bundle = Bundle.load(bundle_dir)
    captions = []
    with FeatureStore(features, n_regions=REGIONS) as store:
        for start in range(0, len(ids), bundle.batch_size):
            chunk = ids[start:start + bundle.batch_size]
            feats, mask = store.get_batch(chunk + [chunk[-1]] * (bundle.batch_size - len(chunk)))
            hyp = bundle.decode(bundle.encode(feats, mask), DecodeOptions(beam_size=2, max_len=bundle.max_len))
            captions += bundle.captions(hyp)[: len(chunk)]
    return captions


@pytest.mark.slow
def test_a_features_checkpoint_scores_the_test_split_as_its_bundle_does(world, m2_features, tmp_path, run_cli):
    from edgecap.train.split_captions import ciderd

    config = tmp_path / "features.toml"
    config.write_text(to_toml(_config(world, m2_features).to_dict()))
    run = tmp_path / "run"
    code, stdout, err = run_cli("train", "--config", config, "--out", run, "--test", "--quiet")
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    test_line = next(line for line in stdout.splitlines() if line.startswith("test split: CIDEr-D"))
    assert f"{summary['test_cider_d']:.3f}" in test_line and "eval coco" in test_line and "--split test" in test_line
    trained = json.loads((run / "test_captions.json").read_text())
    test_ids = [im["cocoid"] for im in json.loads((world / "dataset_coco.json").read_text())["images"]
                if im["split"] == "test"]
    assert [r["image_id"] for r in trained] == test_ids
    record = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert record["kind"] == "test" and record["beam"] == 2 and record["images"] == len(test_ids)

    # the saved checkpoint, captioned from the features file by the CLI: the same captions
    out = tmp_path / "test.json"
    code, stdout, err = run_cli("caption", run / "best.pt", "--features", m2_features, "--split", "test",
                                "--beam", 2, "--json", out, "--quiet")
    assert code == 0, err
    assert json.loads(out.read_text()) == trained
    assert f"CIDEr-D {summary['test_cider_d']:.4f}" in stdout
    assert any(line.startswith("next: edgecap eval coco --captions") for line in stdout.splitlines())
    code, stdout, err = run_cli("eval", "coco", "--captions", out, "--refs", world / "dataset_coco.json",
                                "--split", "test")
    assert code == 0, err
    assert "CIDEr" in stdout

    # the exported bundle on the same images
    code, _, err = run_cli("export", run / "best.pt", "--engine", "onnx", "--beam", 2, "--out", tmp_path / "bundle",
                           "--samples", 4, "--quiet")
    assert code == 0, err
    from edgecap.data.karpathy import load_karpathy

    items = load_karpathy(world / "dataset_coco.json", splits=("test",)).test
    bundle = _bundle_captions(tmp_path / "bundle", m2_features, [im.image_id for im in items])
    same = np.mean([a == b["caption"] for a, b in zip(bundle, trained, strict=True)])
    assert same >= 0.9  # beam ties may break the other way in onnxruntime
    if same == 1.0:
        assert ciderd(items, bundle) == pytest.approx(summary["test_cider_d"], abs=1e-12)


def test_caption_split_refusals(world, m2_features, tmp_path, run_cli):
    run = tmp_path / "run"
    Trainer(_config(world, m2_features), out=run, max_steps=2, progress=False).run()
    from edgecap.train.command import report

    summary = Trainer(_config(world, m2_features), out=run, resume=True, progress=False).run()
    evaluate = next(line for line in report(summary) if line.startswith("evaluate: "))
    assert evaluate.startswith(f"evaluate: edgecap caption {run / 'best.pt'} --split test --json {run / 'test.json'}")
    code, _, err = run_cli("caption", run / "best.pt", tmp_path / "x.jpg")
    assert code == 1 and "--features FILE.h5 --split test" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("caption", run / "best.pt", "--features", m2_features)
    assert code == 1 and "--features goes with --split" in err
    code, _, err = run_cli("caption", run / "best.pt", "--split", "test", "--features", tmp_path / "none.h5")
    assert code == 1 and "none.h5" in err
    # the training features are the default
    code, stdout, err = run_cli("caption", run / "best.pt", "--split", "val", "--quiet")
    assert code == 0 and "val split:" in stdout, err


def _with_nan(src, dst, image_ids):
    """A copy of the features file with every value of `image_ids`' features NaN (a diverged
    extractor writes that; h5py stores it as is)."""
    import shutil

    import h5py

    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        for image_id in image_ids:
            f[f"{image_id}_features"][...] = np.nan
    return dst


def test_caption_split_and_train_on_nan_features_are_refused_naming_the_image(world, m2_features, tmp_path, run_cli):
    """`caption --split test --features nan.h5` printed "mouse mouse mouse ..." with exit 0."""
    doc = json.loads((world / "dataset_coco.json").read_text())
    first_test = next(im["cocoid"] for im in doc["images"] if im["split"] == "test")
    run = tmp_path / "run"
    Trainer(_config(world, m2_features), out=run, max_steps=1, progress=False).run()
    nan = _with_nan(m2_features, tmp_path / "nan.h5", [first_test])
    out = tmp_path / "test.json"
    code, stdout, err = run_cli("caption", run / "best.pt", "--split", "test", "--features", nan, "--json", out,
                                "--quiet")
    assert code == 1 and not out.exists()
    import h5py

    with h5py.File(nan, "r") as f:
        values = f[f"{first_test}_features"].size
    assert err.strip().splitlines() == [
        f"edgecap caption: error: features file {nan}: '{first_test}_features' holds {values} NaN or "
        f"infinite values of {values}; a captioner cannot read them (extract the features again)"]
    everything = _with_nan(m2_features, tmp_path / "all-nan.h5", [im["cocoid"] for im in doc["images"]])
    config = tmp_path / "nan.toml"
    config.write_text(to_toml(_config(world, everything).to_dict()))
    code, _, err = run_cli("train", "--config", config, "--out", tmp_path / "nan-run", "--max-steps", 1, "--quiet")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"features file {everything}: '" in err and "NaN or infinite values" in err
