"""Distributed training: `torchrun --nproc_per_node=2` with gloo on CPU, on tiny data."""

import json

import pytest
from _train_tiny import TINY_MODEL, run_ddp, tiny_config


@pytest.mark.slow
def test_two_process_gloo_run(tmp_path):
    from edgecap.data.synth import generate_dataset

    world = tmp_path / "data"
    generate_dataset(world, 40, seed=3, size=32, sequences=0, video_frames=0, progress=False)
    cfg = tiny_config(world, schedule={"epochs": 1, "warmup": 5},
                      scst={"epochs": 1, "beam_size": 2, "lr": 1e-4}, data={"val_batch_size": 4})
    out, proc = run_ddp(tmp_path, cfg)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["done"]
    # 36 training images split over 2 ranks, 4 per step: 5 steps per epoch, XE then SCST
    assert summary["step"] == 10
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 11))  # one writer: no duplicated lines
    assert [r["phase"] for r in records if r["kind"] == "val"] == ["xe", "scst"]
    assert proc.stdout.count("finished at step 10") == 1  # only rank 0 reports
    for name in ("last.pt", "last.state.pt", "best.pt", "best_xe.pt", "curves.png", "vocab.json"):
        assert (out / name).is_file(), name
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no half-written temporary files

    import torch

    state = torch.load(out / "last.state.pt", weights_only=True)
    assert len(state["rng"]) == 2  # every rank's RNG is kept for an exact resume


@pytest.mark.slow
def test_zero_memory_slots_do_not_stall_ddp(tmp_path):
    """smart-nomem has empty (M = 0) memory parameters; DDP must not wait for their gradients."""
    from _train_tiny import TINY_MODEL

    from edgecap.data.synth import generate_dataset

    world = tmp_path / "data"
    generate_dataset(world, 40, seed=3, size=32, sequences=0, video_frames=0, progress=False)
    model = {**TINY_MODEL, "preset": "smart-nomem", "memory": {"slots": 0}}
    out, _ = run_ddp(tmp_path, tiny_config(world, model=model, schedule={"epochs": 1}))
    assert json.loads((out / "summary.json").read_text())["step"] == 5


@pytest.mark.slow
def test_the_logged_loss_is_the_mean_over_ranks(tmp_path):
    """Step 1 under 2 processes: both ranks start from the same weights (no dropout), so the
    loss each rank's shard gives can be computed here; the log holds their mean, not rank 0's."""
    import torch

    from edgecap.data.datasets import EpochBatchSampler, collate
    from edgecap.data.synth import generate_dataset
    from edgecap.train.loop import Trainer
    from edgecap.train.xe import xe_step

    world = tmp_path / "data"
    generate_dataset(world, 40, seed=3, size=32, sequences=0, video_frames=0, progress=False)
    cfg = tiny_config(world, model={**TINY_MODEL, "dropout": 0.0}, schedule={"epochs": 1, "warmup": 5})
    out, _ = run_ddp(tmp_path, cfg)
    logged = next(json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in x)
    assert logged["step"] == 1

    trainer = Trainer(cfg, out=tmp_path / "here", progress=False)
    trainer.setup()
    trainer.module.train()
    losses = []
    with torch.no_grad():
        for rank in (0, 1):
            sampler = EpochBatchSampler(len(trainer.train_set), 4, seed=0, rank=rank, world=2)
            sampler.set_epoch(0)
            indices = next(iter(sampler))
            batch = collate([trainer.train_set[i] for i in indices], pad_id=trainer.vocab.pad_id)
            losses.append(float(xe_step(trainer.module, batch, trainer.vocab.pad_id)))
    assert losses[0] != pytest.approx(losses[1], abs=1e-4)  # the shards differ, so the mean is not rank 0's
    assert logged["loss"] == pytest.approx(sum(losses) / 2, abs=1e-5)
