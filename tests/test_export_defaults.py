"""`edgecap export` as a new user first meets it: where the bundle goes when no --out is given,
its permissions, which inputs the parity gate ran on, and a quiet console."""

import json
import logging
import os
import stat

import pytest

pytest.importorskip("torch")

from edgecap.contract.manifest import load_manifest  # noqa: E402
from tests._export_util import save_tiny  # noqa: E402

CNN = {"visual": {"kind": "cnn", "image_size": 16, "channels": [8, 24]}, "n_regions": 16}
WORLD = {"images": 30, "seed": 3, "size": 32, "image_format": "png", "dir": ""}


def _synth_meta() -> dict:
    """The meta `edgecap train` stores for a synthetic-world run (its parsed config)."""
    return {"step": 5, "train_config": {"data": {"synth": dict(WORLD)}, "run": {"out": ""}}}


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_default_out_is_beside_the_checkpoint_with_ordinary_permissions(run_cli, tmp_path, monkeypatch, umask022):
    run = tmp_path / "runs" / "demo"
    ckpt = save_tiny(run / "best.pt", "smart-nomem", **CNN)
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    code, stdout, err = run_cli("export", ckpt, "--engine", "onnx", "--samples", 1, "--quiet")
    assert code == 0, err
    bundle = run / "best-onnx-fp32-b1k3"
    assert load_manifest(bundle).beam_size == 3
    assert list(cwd.iterdir()) == []  # nothing dropped into the working directory
    assert f"wrote {bundle} (beside the checkpoint: no --out given)" in stdout
    # mkdtemp's 0700 would lock out the robot's service user
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in bundle.iterdir()} == {0o644}


def test_default_out_taken_says_how_to_choose_another(run_cli, tmp_path):
    ckpt = save_tiny(tmp_path / "best.pt", "smart-nomem", **CNN)
    assert run_cli("export", ckpt, "--engine", "onnx", "--samples", 1, "--quiet")[0] == 0
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--samples", 1, "--quiet")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "best-onnx-fp32-b1k3 already exists" in err and "--force" in err and "--out DIR" in err


def test_parity_runs_on_the_training_world_found_beside_the_checkpoint(run_cli, tmp_path):
    from edgecap.data.synth import generate_dataset

    run = tmp_path / "run"
    generate_dataset(run / "data", WORLD["images"], seed=WORLD["seed"], size=WORLD["size"], sequences=0,
                     video_frames=0, image_format=WORLD["image_format"], progress=False)
    ckpt = save_tiny(run / "best.pt", "smart-nomem", meta=_synth_meta(), **CNN)
    code, stdout, err = run_cli("export", ckpt, "--engine", "onnx", "--out", tmp_path / "b", "--samples", 2,
                                "--quiet")
    assert code == 0, err
    report = load_manifest(tmp_path / "b").parity["onnxruntime"]
    assert report.inputs == f"the training world {run / 'data'} (2 images)"
    assert report.cider_references == "dataset" and not report.random_inputs
    assert "WARNING" not in stdout and f"parity inputs: the training world {run / 'data'}" in stdout


def test_parity_regenerates_scenes_of_a_synthetic_world_that_is_gone(run_cli, tmp_path):
    ckpt = save_tiny(tmp_path / "moved.pt", "smart-nomem", meta=_synth_meta(), **CNN)
    code, stdout, err = run_cli("export", ckpt, "--engine", "onnx", "--out", tmp_path / "b", "--samples", 3,
                                "--quiet")
    assert code == 0, err
    report = load_manifest(tmp_path / "b").parity["onnxruntime"]
    assert report.inputs.startswith("a fresh synthetic world like the training one (seed 4, 32 px, png")
    assert report.samples == 3 and report.cider_references == "dataset" and not report.random_inputs
    assert "WARNING" not in stdout
    assert not [p for p in tmp_path.iterdir() if p.name not in ("moved.pt", "b")]


def test_parity_on_random_inputs_is_flagged_loudly(run_cli, tmp_path):
    ckpt = save_tiny(tmp_path / "nodata.pt", "smart-nomem", **CNN)
    code, stdout, err = run_cli("export", ckpt, "--engine", "onnx", "--out", tmp_path / "b", "--samples", 1,
                                "--quiet")
    assert code == 0, err
    report = load_manifest(tmp_path / "b").parity["onnxruntime"]
    assert report.random_inputs and report.inputs.startswith("random inputs")
    warning = [line for line in stdout.splitlines() if "WARNING" in line]
    assert len(warning) == 1 and "random noise" in warning[0] and "--data DIR" in warning[0]


def test_data_flag_takes_a_dataset_folder(run_cli, tmp_path):
    from edgecap.data.synth import generate_dataset

    data = tmp_path / "mine"
    generate_dataset(data, 20, seed=9, size=32, sequences=0, video_frames=0, progress=False)
    ckpt = save_tiny(tmp_path / "c.pt", "smart-nomem", **CNN)
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", tmp_path / "b", "--samples", 1,
                           "--data", data, "--quiet")
    assert code == 0, err
    report = json.loads((tmp_path / "b" / "manifest.json").read_text())["parity"]["onnxruntime"]
    assert report["inputs"] == f"--data {data} (1 images)" and report["cider_references"] == "dataset"


def test_export_logs_no_initializer_deduplication_notice(tmp_path, caplog):
    from tests._export_util import export

    ckpt = save_tiny(tmp_path / "c.pt", "smart-nomem", **CNN)
    with caplog.at_level(logging.DEBUG):
        export(ckpt, tmp_path / "b")
    assert not [r for r in caplog.records if "Skipped deduplication" in r.getMessage()]
