"""Exact resume: N steps straight == N/2 steps, stop, --resume, N/2 steps (losses, weights)."""

import json
import shlex

import pytest
import torch
from _train_tiny import tiny_config

from edgecap.errors import EdgecapError
from edgecap.train.loop import Trainer


def losses(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["phase"], r["loss"]) for r in lines if r["kind"] == "train"]


def weights(run, name="last.pt"):
    return torch.load(run / name, weights_only=True)["state_dict"]


def test_resumed_run_reproduces_the_uninterrupted_one(world, tmp_path):
    # augmentation, dropout and a stop in the middle of an epoch (9 steps per epoch) and of a
    # logging interval: everything random must come back exactly.
    cfg = tiny_config(world, data={"augment": "shift"}, schedule={"epochs": 2, "warmup": 5},
                      run={"log_every": 2})
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(cfg, out=straight, progress=False).run()
    first = Trainer(cfg, out=split, max_steps=13, progress=False).run()
    assert first["stopped"] and first["step"] == 13
    assert losses(split) == [x for x in losses(straight) if x[0] <= 12]  # 13 waits in the log accumulator
    second = Trainer(cfg, out=split, resume=True, progress=False).run()
    assert second["done"] and second["step"] == 18
    assert losses(split) == losses(straight)
    a, b = weights(straight), weights(split)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_across_the_scst_switch(world, tmp_path):
    cfg = tiny_config(world, schedule={"epochs": 1, "warmup": 5}, scst={"epochs": 1, "beam_size": 2, "lr": 1e-4},
                      data={"val_batch_size": 4})
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(cfg, out=straight, progress=False).run()
    Trainer(cfg, out=split, max_steps=9, progress=False).run()  # the last XE step
    Trainer(cfg, out=split, resume=True, max_steps=12, progress=False).run()
    Trainer(cfg, out=split, resume=True, progress=False).run()
    got, want = losses(split), losses(straight)
    assert [p for _, p, _ in want].count("scst") == 9
    assert got == want
    a, b = weights(straight), weights(split)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_errors(world, tmp_path):
    cfg = tiny_config(world, schedule={"epochs": 1})
    with pytest.raises(EdgecapError, match="has no last.pt"):
        Trainer(cfg, out=tmp_path / "none", resume=True, progress=False).run()
    Trainer(cfg, out=tmp_path / "run", max_steps=2, progress=False).run()
    changed = tiny_config(world, schedule={"epochs": 1}, optim={"lr": 0.5})
    with pytest.raises(EdgecapError, match=r"config differs .* at optim.lr \(0.05 -> 0.5\)"):
        Trainer(changed, out=tmp_path / "run", resume=True, progress=False).run()
    # a run saved by the version-1 layout (weights in last.pt only) whose two files disagree
    state = torch.load(tmp_path / "run" / "last.state.pt", weights_only=True)
    state = {**{k: v for k, v in state.items() if k not in ("weights", "meta")}, "version": 1}
    state["state"]["step"] = 1
    torch.save(state, tmp_path / "run" / "last.state.pt")
    with pytest.raises(EdgecapError, match="a save was interrupted"):
        Trainer(cfg, out=tmp_path / "run", resume=True, progress=False).run()


def test_a_killed_run_resumes_from_its_last_save_without_duplicate_log_lines(world, tmp_path):
    cfg = tiny_config(world, schedule={"epochs": 1}, run={"save_every": 4})
    run = tmp_path / "run"
    Trainer(cfg, out=run, max_steps=6, progress=False).run()
    # simulate a kill after step 6 was logged but before its save: last.* are from step 4
    Trainer(cfg, out=tmp_path / "at4", max_steps=4, progress=False).run()
    for name in ("last.pt", "last.state.pt"):
        (run / name).write_bytes((tmp_path / "at4" / name).read_bytes())
    Trainer(cfg, out=run, resume=True, progress=False).run()
    steps = [s for s, _, _ in losses(run)]
    assert steps == list(range(1, 10))


def test_cli_stop_and_resume(world, tmp_path, run_cli):
    from edgecap.train.config import to_toml

    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(tiny_config(world, schedule={"epochs": 1}).to_dict()))
    out = tmp_path / "run"
    code, stdout, _ = run_cli("train", "--config", config, "--out", out, "--max-steps", 3, "--quiet")
    assert code == 0 and "stopped at step 3" in stdout
    code, _, stderr = run_cli("train", "--config", config, "--out", out, "--quiet")
    assert code == 1 and "pass --resume" in stderr and len(stderr.strip().splitlines()) == 1
    code, stdout, _ = run_cli("train", "--config", config, "--out", out, "--resume", "--quiet")
    assert code == 0 and "finished at step 9" in stdout
    code, _, stderr = run_cli("train", "--config", tmp_path / "missing.toml")
    assert code == 1 and "missing.toml does not exist" in stderr


def test_a_stop_before_any_validation_leaves_a_validated_best_pt_without_changing_the_run(world, tmp_path):
    from edgecap.models.checkpoint import load_checkpoint

    cfg = tiny_config(world, schedule={"epochs": 2, "warmup": 5}, data={"augment": "shift"})
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(cfg, out=straight, progress=False).run()
    first = Trainer(cfg, out=split, max_steps=4, progress=False).run()  # mid epoch 1 (9 steps)
    best = first["best_checkpoint"]
    assert best["path"] == str(split / "best.pt") and best["step"] == 4 and best["validated_at_stop"]
    ck = load_checkpoint(split / "best.pt")  # what the README's next step (export) loads
    assert ck.meta["step"] == 4 and ck.meta["validated_at_stop"] and ck.meta["val_cider_d"] == best["val_cider_d"]
    assert torch.equal(weights(split, "best.pt")["fc.weight"], weights(split)["fc.weight"])
    Trainer(cfg, out=split, resume=True, progress=False).run()
    # the extra validation drew no randomness and moved no best: the runs end identical
    assert losses(split) == losses(straight)
    for name in ("last.pt", "best.pt", "best_xe.pt"):
        a, b = weights(straight, name), weights(split, name)
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert not load_checkpoint(split / "best.pt").meta.get("validated_at_stop")


def test_cli_names_the_checkpoint_to_use_after_a_stop(world, tmp_path, run_cli):
    from edgecap.train.config import to_toml

    config = tmp_path / "tiny.toml"
    config.write_text(to_toml(tiny_config(world, schedule={"epochs": 1}).to_dict()))
    out = tmp_path / "my rün"  # the printed next step must paste into a shell as it is
    code, stdout, err = run_cli("train", "--config", config, "--out", out, "--max-steps", 2, "--quiet")
    assert code == 0, err
    assert f"checkpoint: {out / 'best.pt'} (step 2, xe, validation CIDEr-D" in stdout
    assert "validated when --max-steps stopped the run" in stdout
    next_step = next(line for line in stdout.splitlines() if line.startswith("next: "))
    assert shlex.split(next_step.split("   (")[0])[1:] == ["edgecap", "export", str(out / "best.pt"),
                                                         "--target", "cpu-ort-fp32"]
    assert "--resume" in stdout
    code, stdout, err = run_cli("export", out / "best.pt", "--engine", "onnx", "--samples", 1, "--quiet")
    assert code == 0, err
