"""A training config's relative paths are relative to the directory the run started in, for
`edgecap train`, `train --resume` (with or without --config) and `export`, wherever they run."""

import shutil

from _train_tiny import tiny_config

from edgecap.train.config import to_toml


def _project(root):
    """A project folder as a user keeps it: data/ and configs/ with paths relative to the folder."""
    from edgecap.data.synth import generate_dataset

    generate_dataset(root / "data" / "w", 20, seed=5, size=32, sequences=0, video_frames=0, progress=False)
    table = tiny_config(root / "unused", schedule={"epochs": 1}).to_dict()
    table["data"].pop("synth")
    table["data"].update(karpathy="data/w/dataset_coco.json", images="data/w/images")
    (root / "configs").mkdir()
    (root / "configs" / "tiny.toml").write_text(to_toml(table))
    return root


def test_resume_from_another_directory_reads_the_data_the_run_started_with(tmp_path, run_cli, monkeypatch):
    project = _project(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(project)
    code, stdout, err = run_cli("train", "--config", "configs/tiny.toml", "--out", "runs/t", "--max-steps", 1, "--quiet")
    assert code == 0 and "stopped at step 1" in stdout, err
    assert "or: edgecap train --resume runs/t" in stdout
    monkeypatch.chdir(elsewhere)
    # the run's own config (no --config), then the original config file named from here
    code, stdout, err = run_cli("train", "--resume", "../project/runs/t", "--max-steps", 2, "--quiet")
    assert code == 0 and "stopped at step 2" in stdout, err
    code, stdout, err = run_cli("train", "--config", "../project/configs/tiny.toml", "--out", "../project/runs/t",
                                "--resume", "--quiet")
    assert code == 0 and "finished at step 5" in stdout, err  # 18 train + restval images, 4 per step, 1 epoch
    assert not (elsewhere / "data").exists() and not (elsewhere / "runs").exists()
    from edgecap.models.checkpoint import read_payload

    assert read_payload(project / "runs" / "t" / "best.pt")["meta"]["train_cwd"] == str(project)


def test_a_missing_relative_data_path_is_one_line_naming_key_and_place(tmp_path, run_cli, monkeypatch):
    project = _project(tmp_path / "project")
    monkeypatch.chdir(project)
    code, _, err = run_cli("train", "--config", "configs/tiny.toml", "--out", "runs/t", "--max-steps", 1, "--quiet")
    assert code == 0, err
    shutil.rmtree(project / "data" / "w" / "images")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("train", "--resume", "project/runs/t", "--quiet")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert (f"[data].images = 'data/w/images': {project / 'data' / 'w' / 'images'} does not exist (relative paths "
            f"are relative to the directory the run started in, {project}, not to the config's folder)") in err
    code, _, err = run_cli("train", "--config", "project/configs/tiny.toml", "--out", "x", "--quiet")
    assert code == 1 and f"[data].karpathy = 'data/w/dataset_coco.json': {tmp_path / 'data'}" in err
    assert not (tmp_path / "x").exists()  # nothing written for a run that cannot start


def test_a_config_written_next_to_its_data_is_told_where_its_paths_point(tmp_path, run_cli, monkeypatch):
    """The rule stays the directory the run starts in (the shipped configs and a run's copy of its
    config depend on it), but a config whose data sits beside it gets an error that says so."""
    project = _project(tmp_path / "project")
    mine = project / "data" / "w" / "train.toml"
    text = (project / "configs" / "tiny.toml").read_text()
    mine.write_text(text.replace('"data/w/dataset_coco.json"', '"dataset_coco.json"').replace('"data/w/images"', '"images"'))
    monkeypatch.chdir(project)
    code, _, err = run_cli("train", "--config", mine, "--out", "runs/m", "--max-steps", 1, "--quiet")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert (f"[data].karpathy = 'dataset_coco.json': {project / 'dataset_coco.json'} does not exist (relative paths "
            f"are relative to the directory the run started in, {project}, not to the config's folder); "
            f"{mine.parent / 'dataset_coco.json'} exists beside the config: write that path, or start the run in "
            f"{mine.parent}") in err
    assert not (project / "runs" / "m").exists()
    monkeypatch.chdir(mine.parent)  # as the message says: from there it trains
    code, stdout, err = run_cli("train", "--config", mine, "--out", project / "runs" / "m", "--max-steps", 1, "--quiet")
    assert code == 0 and "stopped at step 1" in stdout, err


def test_resume_cli_forms(tmp_path, run_cli):
    code, _, err = run_cli("train", "--quiet")
    assert code == 1 and "--config is required (or --resume RUN_DIR" in err
    code, _, err = run_cli("train", "--resume", tmp_path / "a", "--out", tmp_path / "b")
    assert code == 1 and "name two run directories" in err
    code, _, err = run_cli("train", "--resume", tmp_path / "a")
    assert code == 1 and f"config {tmp_path / 'a' / 'config.toml'} does not exist" in err


def test_every_file_a_config_reads_follows_the_rule(tmp_path, monkeypatch):
    """features, retrieval index, visual_from and front-end weights resolve like the data; a
    synthetic world's dir may not exist yet (it is generated there)."""
    import pytest

    from edgecap.errors import EdgecapError
    from edgecap.train.config import TrainConfig

    started = tmp_path / "started"
    for name in ("feats.h5", "index/", "smart.pt", "vit.bin", "data.json"):
        (started / name).parent.mkdir(parents=True, exist_ok=True)
        (started / name).mkdir() if name.endswith("/") else (started / name).write_bytes(b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = tiny_config(tmp_path / "w")
    cfg = TrainConfig(**{**cfg.__dict__, "data": type(cfg.data)(karpathy="data.json", features="feats.h5"),
                         "hook_sections": {**cfg.hook_sections,  # a training hook's paths ([retrieval]) too
                                           "retrieval": type(cfg.retrieval)(index="index", visual_from="smart.pt")},
                         "model": {**cfg.model, "visual": {**cfg.model["visual"], "weights": "vit.bin"}}})
    got = cfg.with_paths_from(started)
    assert (got.data.karpathy, got.data.features) == (str(started / "data.json"), str(started / "feats.h5"))
    assert (got.retrieval.index, got.retrieval.visual_from) == (str(started / "index"), str(started / "smart.pt"))
    assert got.model["visual"]["weights"] == str(started / "vit.bin")
    assert cfg.data.features == "feats.h5"  # the written config is kept as written (checkpoints store it)
    (started / "index").rmdir()
    with pytest.raises(EdgecapError, match=rf"\[retrieval\].index = 'index': {started / 'index'} does not exist"):
        cfg.with_paths_from(started)
    synth = tiny_config(tmp_path / "w").__dict__
    synth["data"].synth.dir = "worlds/w"
    assert TrainConfig(**synth).with_paths_from(started).data.synth.dir == str(started / "worlds" / "w")


def test_the_shipped_coco_config_says_where_its_missing_data_comes_from(tmp_path, run_cli, monkeypatch):
    """A new user runs `edgecap train --config configs/coco-smart.toml` before downloading COCO:
    each missing file is named with where to get it, one at a time, nothing written."""
    from pathlib import Path

    config = Path(__file__).resolve().parents[1] / "configs" / "coco-smart.toml"
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("train", "--config", config, "--out", "runs/c", "--quiet")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "[data].karpathy = 'data/coco/dataset_coco.json'" in err
    assert "dataset_coco.json in Karpathy's caption_datasets.zip (docs/training.md#getting-coco)" in err
    world = tmp_path / "data" / "coco"
    world.mkdir(parents=True)
    (world / "dataset_coco.json").write_text('{"images": [], "dataset": "coco"}')
    code, _, err = run_cli("train", "--config", config, "--out", "runs/c", "--quiet")
    assert code == 1 and "[data].features = 'data/coco/coco_detections.hdf5'" in err
    assert "coco_detections.hdf5 as the meshed-memory-transformer README links it" in err
    assert not (tmp_path / "runs").exists()


def test_a_refused_run_leaves_nothing_in_out_and_the_corrected_run_goes_ahead(tmp_path, run_cli, monkeypatch):
    project = _project(tmp_path / "project")
    monkeypatch.chdir(project)
    table = (project / "configs" / "tiny.toml").read_text()
    (project / "configs" / "wrong.toml").write_text(table.replace('kind = "cnn"', 'kind = "features"'))
    code, _, err = run_cli("train", "--config", "configs/wrong.toml", "--out", "runs/t", "--quiet")
    assert code == 1 and "reads precomputed features" in err and len(err.strip().splitlines()) == 1
    assert not (project / "runs" / "t").exists() or not any((project / "runs" / "t").iterdir())
    code, stdout, err = run_cli("train", "--config", "configs/tiny.toml", "--out", "runs/t", "--max-steps", 1, "--quiet")
    assert code == 0 and "stopped at step 1" in stdout, err
