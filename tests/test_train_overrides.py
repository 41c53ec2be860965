"""`edgecap train --set key=value` and `--data DIR`: change a config without editing its TOML."""

import shlex
from pathlib import Path

import pytest

from edgecap.errors import EdgecapError
from edgecap.train.config import parse_config
from edgecap.train.overrides import load_config
from tests.conftest import REPO

DEMO = Path(REPO) / "configs" / "demo-tabletop.toml"


def test_set_changes_typed_values_at_any_depth():
    c = load_config(DEMO, ["schedule.epochs=2", "optim.lr=1", "data.augment=none", "scst.epochs=0",
                           "model.memory.slots=8", "model.visual.channels=[16, 32, 64, 128]",
                           "optim.betas=0.8,0.9", "data.cache_images=false", "data.synth.images=100",
                           'run.out="runs/x"'])
    assert c.schedule.epochs == 2 and c.optim.lr == 1.0 and isinstance(c.optim.lr, float)
    assert c.data.augment == "none" and c.data.cache_images is False and c.data.synth.images == 100
    assert c.optim.betas == (0.8, 0.9) and c.run.out == "runs/x" and c.scst.epochs == 0
    mc = c.model_config(vocab_size=50)
    assert mc.memory.slots == 8 and mc.visual.channels == (16, 32, 64, 128)
    assert mc.d_model == 160  # untouched values stay


def test_changed_config_is_recorded_and_reads_back_the_same():
    c = load_config(DEMO, ["schedule.epochs=3", "model.memory.slots=4"])
    assert c.text.startswith(f"# {DEMO} with --set schedule.epochs=3 --set model.memory.slots=4\n")
    from edgecap.train.overrides import tomllib

    again = parse_config(tomllib.loads(c.text), source="copy")
    assert again.to_dict() == c.to_dict()


@pytest.mark.parametrize("assignment, message", [
    ("schedule.epochs=three", "--set schedule.epochs=three: expected an integer"),
    ("schedule.epoch=3", "schedule has no key 'epoch' (did you mean 'epochs'?)"),
    ("shedule.epochs=3", "unknown section 'shedule' (did you mean 'schedule'?)"),
    ("model.memory=8", "model.memory is a table; set one of its keys, e.g. model.memory.slots=..."),
    ("model.d_modle=8", "model has no key 'd_modle' (did you mean 'd_model'?)"),
    ("model.vocab_size=8", "model has no key 'vocab_size'"),
    ("data.cache_images=yes", "expected true or false"),
    ("optim.lr=fast", "--set optim.lr=fast: expected a number"),
    ("epochs=3", "expected section.key=value"),
    ("schedule.epochs", "expected section.key=value"),
    ("schedule.epochs=-2", "[schedule].epochs = -2: expected >= 0 (after --set schedule.epochs=-2)"),
    ("optim.optimizer=adamx", "expected one of adam, adamw (after --set optim.optimizer=adamx)"),
])
def test_bad_assignments_name_the_set(assignment, message):
    with pytest.raises(EdgecapError) as info:
        load_config(DEMO, [assignment])
    assert message in str(info.value) and "\n" not in str(info.value)


def _dataset(folder: Path) -> Path:
    from edgecap.data.synth import generate_dataset

    generate_dataset(folder, 20, seed=5, size=32, sequences=0, video_frames=0, progress=False)
    return folder


def test_data_points_the_config_at_a_dataset_folder(tmp_path):
    folder = _dataset(tmp_path / "mine")
    c = load_config(DEMO, ["data.batch_size=4"], data_dir=folder)
    assert c.data.synth is None and c.data.karpathy == str(folder / "dataset_coco.json")
    assert c.data.images == str(folder / "images") and c.data.features == "" and c.data.batch_size == 4
    assert c.text.startswith(f"# {DEMO} with --data {folder} --set data.batch_size=4\n")


def test_export_from_another_directory_checks_parity_on_the_relative_data_it_trained_on(
        tmp_path, run_cli, monkeypatch):
    """`--data data/mine` is relative to where training ran; the export a CI job or a second
    shell runs from elsewhere must still find it, not fall back to random noise."""
    from _train_tiny import tiny_config

    from edgecap.train.config import to_toml

    work = tmp_path / "workstation"
    _dataset(work / "data" / "mine")
    config = work / "tiny.toml"
    config.write_text(to_toml(tiny_config(tmp_path / "unused", schedule={"epochs": 1}).to_dict()))
    monkeypatch.chdir(work)
    code, _, err = run_cli("train", "--config", "tiny.toml", "--data", "data/mine", "--out", "run", "--quiet")
    assert code == 0, err
    elsewhere = tmp_path / "ci"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, stdout, err = run_cli("export", work / "run" / "best.pt", "--engine", "onnx", "--out", "b",
                                "--samples", 1, "--quiet")
    assert code == 0, err
    assert f"parity inputs: the training data {work / 'data' / 'mine' / 'dataset_coco.json'}" in stdout
    assert "WARNING" not in stdout


def test_data_for_a_features_model_needs_its_hdf5(tmp_path):
    folder = _dataset(tmp_path / "mine")
    coco = Path(REPO) / "configs" / "coco-smart.toml"
    with pytest.raises(EdgecapError, match=r"reads precomputed features and the folder holds no .h5 / .hdf5 file; "
                                           r"name the file with --set data.features=FILE"):
        load_config(coco, data_dir=folder)
    from tests.test_train_xe import write_features

    # any name: the folder's only HDF5 file, or the one the config names (coco_detections.hdf5)
    write_features(folder, folder / "resnet50.h5")
    assert load_config(coco, data_dir=folder).data.features == str(folder / "resnet50.h5")
    write_features(folder, folder / "vit.h5")
    with pytest.raises(EdgecapError, match=r"holds 2 HDF5 files \(resnet50.h5, vit.h5\)"):
        load_config(coco, data_dir=folder)
    # --set data.features= after --data picks one, as docs/training.md says
    chosen = load_config(coco, ["data.features=" + str(folder / "vit.h5")], data_dir=folder)
    assert chosen.data.features == str(folder / "vit.h5") and chosen.data.karpathy == str(folder / "dataset_coco.json")
    write_features(folder, folder / "coco_detections.hdf5")
    assert load_config(coco, data_dir=folder).data.features == str(folder / "coco_detections.hdf5")


def test_data_errors(tmp_path):
    with pytest.raises(EdgecapError, match="not a directory"):
        load_config(DEMO, data_dir=tmp_path / "nope")
    with pytest.raises(EdgecapError, match="no dataset_coco.json"):
        load_config(DEMO, data_dir=tmp_path)


def test_cli_trains_with_set_and_data(tmp_path, run_cli):
    from _train_tiny import tiny_config

    from edgecap.train.config import to_toml

    folder = _dataset(tmp_path / "data")
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(tiny_config(tmp_path / "unused", schedule={"epochs": 3}).to_dict()))
    out = tmp_path / "my run"  # the suggested fix below must paste into a shell as it is printed
    code, stdout, err = run_cli("train", "--config", config, "--data", folder, "--set", "schedule.epochs=1",
                                "--set", "data.batch_size=8", "--out", out, "--quiet")
    assert code == 0, err
    assert "finished at step 3 (xe)" in stdout  # 18 train + restval images, 8 per step, 1 epoch
    assert not (tmp_path / "unused").exists()  # the config's own synthetic world was not generated
    stored = load_config(out / "config.toml")
    assert stored.schedule.epochs == 1 and stored.data.karpathy == str(folder / "dataset_coco.json")
    # resuming with the same changes matches the stored config; without them it is refused
    code, _, err = run_cli("train", "--config", config, "--out", out, "--resume", "--quiet")
    assert code == 1 and "data.batch_size (8 -> 4)" in err
    suggested = shlex.split(err.split("resume with ")[1].split(" (")[0])
    assert suggested == ["--config", str(out / "config.toml")]
    code, stdout, err = run_cli("train", "--config", out / "config.toml", "--out", out, "--resume", "--quiet")
    assert code == 0 and "finished at step 3" in stdout, err
    code, _, err = run_cli("train", "--config", config, "--set", "schedule.epochs=one")
    assert code == 1 and err.strip() == "edgecap train: error: --set schedule.epochs=one: expected an integer"
