"""The papers' schedule (issue 30): XE until validation CIDEr-D has not improved for `patience`
epochs, SCST from the best XE weights until it has not improved for its own patience; the
same across a --resume at any point. `--init-from` starts a new run (SCST only) from trained
weights.

The schedule is a rule over validation scores, so these tests script the scores (issue 34):
which epoch peaks in a real run depends on the CPU's floating-point kernels (an AVX-512 EPYC
trained the tiny model to another peak than AVX2 did), while the switching logic must hold on
every CPU. The model still trains and decodes for real; only the number it is judged by is
scripted. tests/test_train_xe.py keeps one loose end-to-end check that training improves
validation CIDEr-D."""

import json

import pytest
import torch
from _train_tiny import tiny_config

from edgecap.errors import EdgecapError
from edgecap.train.config import to_toml
from edgecap.train.loop import Trainer

# Validation CIDEr-D per phase and epoch (index 0: a --max-steps stop before the first epoch
# ends). XE peaks at epoch 3 and then stalls: with patience 2 it ends after epoch 5, well before
# its 10-epoch ceiling. SCST (patience 1) improves on XE once, then falls: it ends after epoch 2.
SCRIPT = {"xe": [0.05, 0.2, 0.5, 0.9, 0.7, 0.8, 1.5, 1.6, 1.7, 1.8, 1.9],
          "scst": [0.9, 1.0, 0.95, 2.0, 2.1, 2.2, 2.3]}
XE_BEST_EPOCH, XE_EPOCHS, SCST_EPOCHS = 3, 5, 2
STEPS_PER_EPOCH = 9  # 36 training images, 4 per step


class ScriptedTrainer(Trainer):
    """A Trainer whose validation score comes from SCRIPT; its captions are still decoded."""

    def validate(self, items=None):
        _, captions = super().validate(items)
        return SCRIPT[self.state.phase][self.state.epoch], captions


def _cfg(world, **sections):
    base = {"optim": {"lr": 0.05}, "schedule": {"epochs": 10, "warmup": 5, "patience": 2},
            "scst": {"epochs": 6, "patience": 1, "beam_size": 2, "lr": 1e-4}, "data": {"val_batch_size": 4}}
    for name, table in sections.items():
        base[name] = {**base.get(name, {}), **table}
    return tiny_config(world, **base)


def _records(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _comparable(run):
    """Everything in metrics.jsonl but wall-clock times."""
    out = []
    for r in _records(run):
        if r["kind"] == "train":
            r = {"kind": "train", "step": r["step"], "phase": r["phase"], "loss": r["loss"], "lr": r["lr"],
                 "reward": r.get("reward")}
        out.append(r)
    return out


@pytest.fixture(scope="module")
def straight(world, tmp_path_factory):
    run = tmp_path_factory.mktemp("patience") / "straight"
    summary = ScriptedTrainer(_cfg(world), out=run, progress=False).run()
    return run, summary


def test_xe_then_scst_from_the_best_xe_epoch_each_ending_on_patience(straight):
    run, summary = straight
    records = _records(run)
    xe = [r for r in records if r["kind"] == "val" and r["phase"] == "xe"]
    scst = [r for r in records if r["kind"] == "val" and r["phase"] == "scst"]
    assert [r["cider_d"] for r in xe] == SCRIPT["xe"][1:XE_EPOCHS + 1]
    # XE stopped `patience` epochs after its best, well before the 10-epoch ceiling
    assert [r["epoch"] for r in xe] == list(range(1, XE_EPOCHS + 1))
    assert [r["since_best"] for r in xe] == [0, 0, 0, 1, 2]
    assert [r["best_epoch"] for r in xe] == [1, 2, 3, 3, 3]
    end_xe = next(r for r in records if r["kind"] == "phase_end" and r["phase"] == "xe")
    assert end_xe["reason"] == "patience" and end_xe["best_epoch"] == XE_BEST_EPOCH
    assert end_xe["best_cider_d"] == SCRIPT["xe"][XE_BEST_EPOCH]
    switch = next(r for r in records if r["kind"] == "phase" and r["phase"] == "scst")
    assert switch["step"] == XE_EPOCHS * STEPS_PER_EPOCH
    assert switch["from"] == "best_xe.pt" and switch["from_epoch"] == XE_BEST_EPOCH
    assert switch["from_cider_d"] == SCRIPT["xe"][XE_BEST_EPOCH]
    # best_xe.pt is the best XE epoch's checkpoint, not the last XE epoch's
    best_xe = torch.load(run / "best_xe.pt", weights_only=True)["meta"]
    assert best_xe["step"] == XE_BEST_EPOCH * STEPS_PER_EPOCH
    assert best_xe["val_cider_d"] == SCRIPT["xe"][XE_BEST_EPOCH]
    assert [r["cider_d"] for r in scst] == SCRIPT["scst"][1:SCST_EPOCHS + 1]
    assert [r["since_best"] for r in scst] == [0, 1]
    end = [r for r in records if r["kind"] == "phase_end"][-1]
    assert end["phase"] == "scst" and end["reason"] == "patience" and end["best_epoch"] == 1
    # best.pt: the best score of the whole run, here SCST's first epoch
    best = torch.load(run / "best.pt", weights_only=True)["meta"]
    assert best["val_cider_d"] == SCRIPT["scst"][1]
    assert best["step"] == (XE_EPOCHS + 1) * STEPS_PER_EPOCH
    assert summary["done"] and summary["phase"] == "scst"
    assert summary["best_val_cider_d"] == SCRIPT["scst"][1]
    assert summary["best_xe_val_cider_d"] == SCRIPT["xe"][XE_BEST_EPOCH]


@pytest.mark.parametrize("stops", [(13,), (45,), (45, 50), (27, 46)])
def test_the_patience_schedule_is_the_same_across_a_resume_at_any_point(world, straight, tmp_path, stops):
    # 9 steps per epoch: 13 mid XE, 27 the best XE epoch's end, 45 the switch, 46 / 50 in SCST
    run, _ = straight
    cfg = _cfg(world)
    split = tmp_path / "split"
    for stop in stops:
        ScriptedTrainer(cfg, out=split, resume=split.exists(), max_steps=stop, progress=False).run()
    ScriptedTrainer(cfg, out=split, resume=True, progress=False).run()
    assert _comparable(split) == _comparable(run)
    for name in ("last.pt", "best.pt", "best_xe.pt"):
        a = torch.load(run / name, weights_only=True)["state_dict"]
        b = torch.load(split / name, weights_only=True)["state_dict"]
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_init_from_starts_scst_from_a_trained_checkpoint(world, straight, tmp_path, run_cli):
    run, _ = straight
    cfg = _cfg(world, schedule={"epochs": 0, "patience": 0}, scst={"epochs": 1, "patience": 0},
               data={"min_count": 3}, run={"init_from": str(run / "best_xe.pt")})
    trainer = Trainer(cfg, out=tmp_path / "direct", progress=False)
    trainer.setup()
    want = torch.load(run / "best_xe.pt", weights_only=True)
    got = trainer.model.state_dict()
    assert all(torch.equal(got[k], want["state_dict"][k]) for k in got)
    assert trainer.vocab.to_dict() == want["vocab"]  # its words, not min_count 3's
    # the command line: SCST only, from best_xe.pt
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(_cfg(world).to_dict()))
    code, stdout, err = run_cli("train", "--config", config, "--out", tmp_path / "scst", "--init-from",
                                run / "best_xe.pt", "--set", "schedule.epochs=0", "--set", "scst.epochs=1",
                                "--quiet")
    assert code == 0, err
    records = _records(tmp_path / "scst")
    assert {r["phase"] for r in records if r["kind"] == "train"} == {"scst"}
    assert all("reward" in r for r in records if r["kind"] == "train")
    stored = (tmp_path / "scst" / "config.toml").read_text()
    assert "init_from" in stored and "best_xe.pt" in stored


def test_init_from_refusals(world, straight, tmp_path, run_cli):
    from _train_tiny import TINY_PMA

    run, _ = straight
    other = tiny_config(world, model=TINY_PMA, run={"init_from": str(run / "best.pt")})
    with pytest.raises(EdgecapError, match=r"--init-from .*best.pt.*not the one \[model\] of this config builds"):
        Trainer(other, out=tmp_path / "x", progress=False).run()
    assert not (tmp_path / "x" / "config.toml").exists()
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(_cfg(world).to_dict()))
    code, _, err = run_cli("train", "--config", config, "--out", tmp_path / "y", "--init-from", tmp_path / "no.pt")
    assert code == 1 and "no.pt" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("train", "--resume", run, "--init-from", run / "best.pt")
    assert code == 1 and "--init-from starts a new run" in err


def test_train_init_from_a_bundle_directory_says_it_is_a_bundle(world, straight, tmp_path, run_cli):
    from tests._export_util import export

    run, _ = straight
    bundle = export(run / "best.pt", tmp_path / "bundle").path
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(_cfg(world).to_dict()))
    code, _, err = run_cli("train", "--config", config, "--out", tmp_path / "y", "--init-from", bundle, "--quiet")
    assert code == 1, err
    assert err.strip().splitlines() == [  # it used to say the checkpoint "does not exist"
        f"edgecap train: error: checkpoint {bundle} is an exported bundle (ONNX graphs, no PyTorch weights), not a "
        "checkpoint: name the .pt it was exported from (a run directory's best.pt)"]
    code, _, err = run_cli("train", "--config", config, "--out", tmp_path / "y", "--init-from", run, "--quiet")
    assert code == 1 and f"checkpoint {run} is a directory, not a checkpoint: name a file in it, e.g. " \
        f"{run / 'best.pt'}" in err


def test_train_init_from_with_set_min_count_is_refused_not_ignored(world, straight, tmp_path, run_cli):
    """The vocabulary is the checkpoint's; `--set data.min_count=5` printed "(min_count 5)" over it."""
    from edgecap.train.startup import summary_block

    run, _ = straight
    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(_cfg(world).to_dict()))
    code, _, err = run_cli("train", "--config", config, "--out", tmp_path / "y", "--init-from", run / "last.pt",
                           "--set", "data.min_count=5", "--quiet")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "--set data.min_count=5: a run started from --init-from" in err and "keeps that checkpoint's vocabulary" in err
    assert not (tmp_path / "y").exists()
    # a config's own min_count (every config has one) is not refused: the summary says it does not apply
    trainer = Trainer(_cfg(world, data={"min_count": 5}, run={"init_from": str(run / "last.pt")}), out=tmp_path / "z",
                      progress=False)
    trainer.setup()
    line = next(x for x in summary_block(trainer) if "vocabulary" in x)
    assert f"vocabulary: {len(trainer.vocab)} words (the --init-from checkpoint's; [data].min_count does not apply)" \
        in line


def test_a_finished_run_resumed_with_more_phases_goes_on_as_if_planned(world, tmp_path, run_cli):
    planned = _cfg(world, schedule={"epochs": 2, "patience": 0}, scst={"epochs": 1, "patience": 0})
    xe_only = _cfg(world, schedule={"epochs": 2, "patience": 0}, scst={"epochs": 0, "patience": 0})
    straight = tmp_path / "straight"
    Trainer(planned, out=straight, progress=False).run()
    config = tmp_path / "xe.toml"
    config.write_text(to_toml(xe_only.to_dict()))
    run = tmp_path / "run"
    code, stdout, err = run_cli("train", "--config", config, "--out", run, "--quiet")
    assert code == 0 and "finished at step 18 (xe)" in stdout, err
    # the SCST the papers run next, on the same run directory
    code, stdout, err = run_cli("train", "--resume", run, "--set", "scst.epochs=1", "--quiet")
    assert code == 0 and "finished at step 27 (scst)" in stdout, err
    assert "resuming with scst.epochs (0 -> 1)" in err
    assert _comparable(run) == _comparable(straight)
    a = torch.load(straight / "last.pt", weights_only=True)["state_dict"]
    b = torch.load(run / "last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert "epochs = 1" in (run / "config.toml").read_text().split("[scst]")[1]
    # what may not change: XE once SCST has run, anything but phase lengths
    code, _, err = run_cli("train", "--resume", run, "--set", "schedule.epochs=5", "--quiet")
    assert code == 1 and "its XE phase is over" in err
    code, _, err = run_cli("train", "--resume", run, "--set", "optim.lr=0.1", "--quiet")
    assert code == 1 and "config differs" in err and "may change on resume" in err
