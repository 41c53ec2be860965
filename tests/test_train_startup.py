"""What `train` says before its first step (issue 30): a summary block, a plain progress line
per metrics line when stderr is not a terminal, and one warning line for each setting that
would waste the run; each warning appears when it should and not otherwise."""

import json
import re

import numpy as np
import pytest
from _train_tiny import TINY_MODEL, tiny_config

from edgecap.train.config import parse_config, to_toml
from edgecap.train.loop import Trainer

CLEAN = {"schedule": {"epochs": 1, "warmup": 5}, "optim": {"lr": 0.05}}


def _warnings(capsys, cfg, out, **kwargs):
    capsys.readouterr()
    Trainer(cfg, out=out, max_steps=1, progress=False, **kwargs).run()
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("edgecap: warning:")]


def test_a_sane_run_warns_about_nothing(world, tmp_path, capsys):
    assert _warnings(capsys, tiny_config(world, **CLEAN), tmp_path / "run") == []


def test_a_warm_up_longer_than_the_run(world, tmp_path, capsys):
    got = _warnings(capsys, tiny_config(world, schedule={"epochs": 1, "warmup": 10000}, optim={"lr": 1.0}),
                    tmp_path / "run")
    assert len(got) == 1, got
    assert "[schedule].warmup = 10000 steps is longer than the whole XE phase (9 steps" in got[0]
    assert "--set schedule.warmup=" in got[0]


@pytest.mark.parametrize("lr, warned", [(0.3, True), (0.05, False), (0.0001, True)])
def test_a_peak_learning_rate_outside_the_sane_range(world, tmp_path, capsys, lr, warned):
    got = _warnings(capsys, tiny_config(world, schedule={"epochs": 1, "warmup": 5}, optim={"lr": lr}),
                    tmp_path / "run")
    assert len(got) == int(warned), got
    if warned:
        assert "the XE learning rate peaks at" in got[0] and f"[optim].lr = {lr!r}" in got[0]


def _features_file(world, path, same: bool, provenance=None):
    """Features for every image of the world: all one vector (plus a little noise), or each
    image's own pixels pooled over a grid."""
    import cv2

    from edgecap.data.features import FeatureWriter

    doc = json.loads((world / "dataset_coco.json").read_text())
    rng = np.random.default_rng(0)
    base = rng.normal(size=(4, 16)).astype(np.float32)
    with FeatureWriter(path, provenance) as writer:
        for im in doc["images"]:
            if same:
                feats = base + 0.01 * rng.normal(size=base.shape).astype(np.float32)
            else:
                bgr = cv2.imread(str(world / "images" / im["filepath"] / im["filename"])).astype(np.float32)
                cells = cv2.resize(bgr / 255 - 0.5, (2, 2), interpolation=cv2.INTER_AREA).reshape(4, 3)
                feats = np.concatenate([cells, rng.normal(size=(4, 13)).astype(np.float32)], 1)
            writer.write(im["cocoid"], feats)
    return path


def _features_config(world, features):
    model = {**TINY_MODEL, "visual": {"kind": "features"}, "n_regions": 4}
    return parse_config({"model": model,
                         "data": {"karpathy": str(world / "dataset_coco.json"), "features": str(features),
                                  "batch_size": 4, "min_count": 1, "val_batch_size": 8},
                         **CLEAN, "run": {"threads": 1}}, source="features.toml")


def test_features_that_are_nearly_identical(world, tmp_path, capsys):
    same = _features_file(world, tmp_path / "same.h5", same=True)
    got = _warnings(capsys, _features_config(world, same), tmp_path / "a")
    assert len(got) == 1, got
    assert re.search(r"features of 32 training images are nearly identical \(mean pairwise cosine (0\.99\d|1\.000) "
                     r"> 0\.98\)", got[0]), got
    varied = _features_file(world, tmp_path / "varied.h5", same=False)
    assert _warnings(capsys, _features_config(world, varied), tmp_path / "b") == []


def test_features_extracted_with_random_weights(world, tmp_path, capsys):
    provenance = {"kind": "torchvision", "backbone": "resnet50", "weights_sha256": "random", "n_regions": 4,
                  "dim": 16}
    features = _features_file(world, tmp_path / "random.h5", same=False, provenance=provenance)
    got = _warnings(capsys, _features_config(world, features), tmp_path / "a")
    assert len(got) == 1 and "the resnet50 front end has random weights" in got[0], got
    assert "random.h5 was extracted without --weights" in got[0]
    provenance["weights_sha256"] = "0" * 64
    features = _features_file(world, tmp_path / "weighted.h5", same=False, provenance=provenance)
    assert _warnings(capsys, _features_config(world, features), tmp_path / "b") == []


def test_a_front_end_with_random_weights(world, tmp_path, capsys):
    import torch
    import torchvision

    model = {**TINY_MODEL, "visual": {"kind": "torchvision", "backbone": "mobilenet_v3_large", "image_size": 32}}
    model.pop("d_in"), model.pop("n_regions"), model.pop("encoder_positions")
    got = _warnings(capsys, tiny_config(world, model=model, **CLEAN), tmp_path / "a")
    assert any("the mobilenet_v3_large front end has random weights" in line and "--visual-weights FILE" in line
               for line in got), got
    weights = tmp_path / "mobilenet.pth"
    torch.save(torchvision.models.mobilenet_v3_large(weights=None).state_dict(), weights)
    cfg = tiny_config(world, model=model, **CLEAN).with_visual_weights(weights)
    got = _warnings(capsys, cfg, tmp_path / "b")
    assert not any("random weights" in line for line in got), got


def test_the_summary_block_and_plain_progress_lines_into_a_log(world, tmp_path, run_cli):
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(tiny_config(world, **CLEAN, run={"log_every": 3}).to_dict()))
    code, _, err = run_cli("train", "--config", config, "--out", tmp_path / "run", "--max-steps", 6)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].startswith(f"run {tmp_path / 'run'}: smart, 58,904 parameters (58,904 trained), on cpu x 1 process")
    block = "\n".join(lines[:7])
    for needle in ("train 36, val 2 images", "vocabulary: 94 words (min_count 1)", "16 regions x 16",
                   "xe: 9 steps per epoch of 4 images per process, 1 epoch", "validation: 2 images, beam 1"):
        assert needle in block, block
    progress = [line for line in lines if line.startswith("xe epoch ")]
    assert [p.split(", loss")[0] for p in progress] == ["xe epoch 1/1, step 3 (batch 3/9)",
                                                        "xe epoch 1/1, step 6 (batch 6/9)"]
    assert all("lr " in p and "steps/s" in p for p in progress)
    code, _, err = run_cli("train", "--resume", tmp_path / "run", "--quiet")
    assert code == 0 and not [line for line in err.splitlines() if line.startswith(("run ", "xe epoch"))], err


def _warned(err):
    return [line for line in err.splitlines() if line.startswith("edgecap: warning:")]


def test_features_extract_export_and_run_warn_about_a_random_front_end(world, tmp_path, run_cli):
    import torch
    import torchvision

    from edgecap.models.frontends import frontend_overrides
    from tests._export_util import CNN, save_tiny

    extract = ["features", "extract", "--backbone", "mobilenet_v3_large", "--image-size", 64, "--images",
               world / "images", "--split-file", world / "dataset_coco.json", "--splits", "val", "--batch-size", 8,
               "--quiet"]
    code, _, err = run_cli(*extract, "--out", tmp_path / "random.h5")
    assert code == 0, err
    assert len(_warned(err)) == 1 and "mobilenet_v3_large front end has random weights" in err
    assert "pass --weights FILE" in err
    weights = tmp_path / "mobilenet.pth"
    torch.save(torchvision.models.mobilenet_v3_large(weights=None).state_dict(), weights)
    code, _, err = run_cli(*extract, "--weights", weights, "--out", tmp_path / "weighted.h5")
    assert code == 0 and _warned(err) == [], err

    frames = world / "images" / "val2014"
    for name, extra, warned in (("random", frontend_overrides("mobilenet_v3_large", image_size=64), True),
                                ("cnn", CNN, False)):
        ckpt = save_tiny(tmp_path / f"{name}.pt", "smart", **extra)
        code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", tmp_path / name, "--samples", 2,
                               "--quiet")
        assert code == 0, err
        assert len(_warned(err)) == int(warned), err
        code, _, err = run_cli("run", tmp_path / name, "--source", frames, "--pace", "every", "--no-coverage",
                               "--jsonl", tmp_path / f"{name}.jsonl")
        assert code == 0, err
        assert len(_warned(err)) == int(warned), err
        if warned:
            assert "export the bundle with --visual-weights FILE" in err
