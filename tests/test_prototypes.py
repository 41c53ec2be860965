"""PMA-Net prototype memory: banks, bounds, refresh stride, Eq. 4, resume, a short training run.

PMA-Net training: prototypes refresh during the run, change the output, and resume exactly.
"""

import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from _train_tiny import TINY_PMA, tiny_config

from edgecap.errors import EdgecapError
from edgecap.models import build
from edgecap.models.attention.prototype import PrototypeAttention
from edgecap.models.checkpoint import load_checkpoint
from edgecap.train.kmeans import compute_prototypes
from edgecap.train.loop import Trainer
from edgecap.train.prototypes import PrototypeMemory
from tests.conftest import REPO, tiny_overrides

PAD = 0
B, L = 4, 7


def tiny_pma(seed=0):
    torch.manual_seed(seed)
    return build("pma-edge", **tiny_overrides("pma-edge"))


def batch(seed, pad_from=None):
    """Random features and BOS-led token rows; row r is padded from pad_from[r] on."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, 6, 24, generator=g)
    fmask = torch.ones(B, 6, dtype=torch.bool)
    tokens = torch.randint(4, 40, (B, L), generator=g)
    tokens[:, 0] = 1
    for r, start in enumerate(pad_from or [L, 5, 3, L]):
        tokens[r, start:] = PAD
    return feats, fmask, tokens


def train_steps(model, memory, steps, start=1, seed=0):
    model.train()
    stats = {}
    for step in range(start, start + steps):
        feats, fmask, tokens = batch(seed + step)
        memory.before_forward(tokens != PAD)
        model(feats, fmask, tokens).sum().backward()
        stats[step] = memory.after_step(step)
    return stats


def test_banks_hold_only_real_tokens_projected_by_the_layer():
    model = tiny_pma()
    memory = PrototypeMemory(model, bank_iterations=10, stride=100, topk=3, max_bank=10_000)
    layer = memory.layers[0]
    seen = {}
    # the layer's key projection sees the layer input x [B, L, d]
    layer.fc_k.register_forward_hook(lambda mod, args, out: seen.setdefault("x", args[0].detach()))
    feats, fmask, tokens = batch(1, pad_from=[L, 5, 3, 2])
    memory.before_forward(tokens != PAD)
    model.train()
    model(feats, fmask, tokens)
    memory.after_step(1)
    real = int((tokens != PAD).sum())
    assert real == 7 + 5 + 3 + 2
    assert memory.bank_size() == real
    step, keys, values = memory.banks[0][0]
    assert step == 1
    with torch.no_grad():
        expect_k = layer.fc_k(seen["x"])[tokens != PAD]
        expect_v = layer.fc_v(seen["x"])[tokens != PAD]
    torch.testing.assert_close(keys, expect_k)
    torch.testing.assert_close(values, expect_v)
    # eval-mode forwards (validation, decoding) never touch the banks
    model.eval()
    model(feats, fmask, tokens)
    memory.after_step(2)
    assert memory.bank_size() == real


def test_banks_are_a_bounded_window_subsampled_deterministically():
    model = tiny_pma()
    a = PrototypeMemory(model, bank_iterations=3, stride=100, topk=3, max_bank=24, seed=5)
    train_steps(model, a, 6)
    # 3 iterations kept, 24 // 3 = 8 of each iteration's 22 real tokens
    assert [c[0] for c in a.banks[0]] == [4, 5, 6]
    assert a.bank_size() == 24
    assert all(c[1].shape[0] == 8 for bank in a.banks for c in bank)
    a.detach()

    def keys_with(seed):
        model = tiny_pma()
        mem = PrototypeMemory(model, bank_iterations=3, stride=100, topk=3, max_bank=24, seed=seed)
        train_steps(model, mem, 4)
        return torch.cat([c[1] for c in mem.banks[1]])

    torch.testing.assert_close(keys_with(5), keys_with(5))
    assert not torch.equal(keys_with(5), keys_with(6))


def test_refresh_happens_at_the_stride_and_installs_prototypes():
    model = tiny_pma()
    memory = PrototypeMemory(model, bank_iterations=50, stride=3, topk=4, max_bank=10_000)
    assert not any(layer.proto_valid.any() for layer in memory.layers)
    stats = train_steps(model, memory, 7)
    assert [s for s, v in stats.items() if v is not None] == [3, 6]
    assert set(stats[3]) >= {"refresh_seconds", "kmeans_seconds", "knn_seconds", "bank_size"}
    assert stats[3]["bank_size"] == 3 * 22 and stats[6]["bank_size"] == 6 * 22
    assert stats[3]["refresh_seconds"] >= stats[3]["kmeans_seconds"] > 0
    for layer in memory.layers:
        assert bool(layer.proto_valid.all())  # 66 bank rows >= m = 6
        assert float(layer.proto_k.abs().sum()) > 0


def test_prototypes_change_the_model_output():
    model = tiny_pma()
    memory = PrototypeMemory(model, bank_iterations=50, stride=2, topk=4, max_bank=10_000)
    feats, fmask, tokens = batch(99)
    model.eval()
    with torch.no_grad():
        before = model(feats, fmask, tokens)
    train_steps(model, memory, 1)
    model.eval()
    with torch.no_grad():
        unchanged = model(feats, fmask, tokens)
    torch.testing.assert_close(unchanged, before)  # filling banks alone changes nothing
    train_steps(model, memory, 1, start=2)
    model.eval()
    with torch.no_grad():
        after = model(feats, fmask, tokens)
    assert float((after - before).abs().max()) > 1e-3


def test_fewer_bank_rows_than_prototypes_uses_every_row():
    model = tiny_pma()  # m = 6
    memory = PrototypeMemory(model, bank_iterations=5, stride=1, topk=2, max_bank=10_000)
    feats, fmask, tokens = batch(3, pad_from=[2, 1, 1, 1])  # 5 real tokens
    model.train()
    memory.before_forward(tokens != PAD)
    model(feats, fmask, tokens)
    stats = memory.after_step(1)
    assert stats["prototypes"] == 5
    for layer, bank in zip(memory.layers, memory.banks, strict=True):
        assert layer.proto_valid.tolist() == [True] * 5 + [False]
        torch.testing.assert_close(layer.proto_k[:5], bank[0][1])


def test_values_follow_eq4_on_two_clusters():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0, 0, 0], [10.0, 10, 0, 0]], dtype=np.float32)
    keys = np.concatenate([c + 0.3 * rng.standard_normal((20, 4)) for c in centres]).astype(np.float32)
    values = rng.standard_normal((40, 4)).astype(np.float32)
    values[20:] += 100.0  # the second cluster's values are far away
    protos = compute_prototypes(keys, values, count=2, topk=5, seed=0, iterations=20)
    order = np.argsort(protos.keys[:, 0])
    pk, pv = protos.keys[order], protos.values[order]
    np.testing.assert_allclose(pk[0], keys[:20].mean(0), atol=1e-4)
    np.testing.assert_allclose(pk[1], keys[20:].mean(0), atol=1e-4)
    for p, v in zip(pk, pv, strict=True):
        dist = np.linalg.norm(keys - p, axis=1)
        near = np.argsort(dist)[:5]
        w = np.exp(-dist[near]) / np.exp(-dist[near]).sum()
        np.testing.assert_allclose(v, (w[:, None] * values[near]).sum(0), rtol=1e-4, atol=1e-4)
    assert pv[0].mean() < 5 < pv[1].mean()  # each value comes from its own cluster only


def test_state_dict_round_trip_gives_identical_refreshes():
    model = tiny_pma()
    memory = PrototypeMemory(model, bank_iterations=4, stride=3, topk=3, max_bank=40, seed=7)
    train_steps(model, memory, 4)
    saved_model = copy.deepcopy(model.state_dict())
    saved = copy.deepcopy(memory.state_dict())
    torch.manual_seed(42)  # the run restores its RNG on resume (dropout draws)
    train_steps(model, memory, 3, start=5)  # refresh at 6
    expect = [(layer.proto_k.clone(), layer.proto_v.clone()) for layer in memory.layers]
    memory.detach()

    resumed = tiny_pma(seed=123)
    resumed.load_state_dict(saved_model)
    memory2 = PrototypeMemory(resumed, bank_iterations=4, stride=3, topk=3, max_bank=40, seed=7)
    memory2.load_state_dict(saved)
    assert memory2.last_step == 4 and memory2.refreshes == 1
    torch.manual_seed(42)
    train_steps(resumed, memory2, 3, start=5)
    for layer, (k, v) in zip(memory2.layers, expect, strict=True):
        torch.testing.assert_close(layer.proto_k, k, rtol=0, atol=0)
        torch.testing.assert_close(layer.proto_v, v, rtol=0, atol=0)


def test_short_xe_training_run_with_a_refresh():
    torch.set_num_threads(1)
    model = tiny_pma()
    memory = PrototypeMemory(model, bank_iterations=20, stride=4, topk=4, max_bank=500)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    losses, refreshed = [], []
    for step in range(1, 9):
        feats, fmask, tokens = batch(step)
        memory.before_forward(tokens != PAD)
        logprobs = model(feats, fmask, tokens)
        target = torch.cat([tokens[:, 1:], torch.full((B, 1), PAD)], dim=1)
        loss = torch.nn.functional.nll_loss(logprobs.transpose(1, 2), target, ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if memory.after_step(step) is not None:
            refreshed.append(step)
    assert refreshed == [4, 8]
    assert all(np.isfinite(losses))
    # the segment embeddings learn once prototypes are visible
    assert model.layers[0].self_attn.segment.grad is not None
    memory.detach()
    assert all(layer.observer is None for layer in memory.layers)


def test_clear_errors():
    with pytest.raises(EdgecapError, match="prototype decoder self-attention"):
        PrototypeMemory(build("smart", **tiny_overrides("smart")))
    with pytest.raises(EdgecapError, match="prototypes.stride=0"):
        PrototypeMemory(tiny_pma(), stride=0)
    model = tiny_pma()
    memory = PrototypeMemory(model)
    feats, fmask, tokens = batch(0)
    model.train()
    with pytest.raises(RuntimeError, match="before_forward"):
        model(feats, fmask, tokens)
    memory.before_forward(torch.ones(B, L - 1, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="does not match"):
        model(feats, fmask, tokens)
    other = PrototypeMemory(build("pma-edge", **{**tiny_overrides("pma-edge"), "dec_layers": 3}))
    with pytest.raises(EdgecapError, match="3 layers"):
        memory.load_state_dict(other.state_dict())


def test_benchmark_quick_mode_writes_results(tmp_path):
    out = tmp_path / "bench"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "prototypes.py"), "--quick", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "prototypes.json").exists() and (out / "prototypes.png").stat().st_size > 0
    assert "faiss" in proc.stdout and "torch" in proc.stdout


DIST_WORKER = r"""
import sys, torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
from conftest import tiny_overrides
from edgecap.models import build
from edgecap.train.prototypes import PrototypeMemory

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
torch.manual_seed(0)
model = build("pma-edge", **tiny_overrides("pma-edge"))
memory = PrototypeMemory(model, bank_iterations=5, stride=2, topk=3, max_bank=1000, seed=1)
model.train()
g = torch.Generator().manual_seed(100 + rank)
for step in (1, 2):
    tokens = torch.randint(4, 40, (3, 5), generator=g)
    tokens[:, 3 + rank:] = 0  # rank 0: 3 real tokens per row, rank 1: 4
    memory.before_forward(tokens != 0)
    model(torch.randn(3, 6, 24, generator=g), torch.ones(3, 6, dtype=torch.bool), tokens)
    stats = memory.after_step(step)
layer = memory.layers[0]
torch.save({{"bank": memory.bank_size(), "k": layer.proto_k, "v": layer.proto_v}}, {out!r} + f"/rank{{rank}}.pt")
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_distributed_banks_cover_the_global_batch_and_ranks_agree(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(DIST_WORKER.format(tests=os.path.join(REPO, "tests"), port=port, out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], env=env, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["bank"] == r1["bank"] == 2 * (3 * 3 + 3 * 4)  # two steps of both ranks' real tokens
    torch.testing.assert_close(r0["k"], r1["k"], rtol=0, atol=0)
    torch.testing.assert_close(r0["v"], r1["v"], rtol=0, atol=0)
    assert float(r0["k"].abs().sum()) > 0


# -- PMA-Net training: refresh during the run, exact resume ----------------------------------------
PROTOTYPES = {"bank_iterations": 4, "stride": 4, "topk": 2, "kmeans_iterations": 5}


def records(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_prototypes_refresh_and_change_the_output(world, tmp_path):
    cfg = tiny_config(world, model=TINY_PMA, prototypes=PROTOTYPES, schedule={"epochs": 2, "warmup": 5})
    run = tmp_path / "run"
    Trainer(cfg, out=run, progress=False).run()
    refreshes = [r for r in records(run) if r["kind"] == "prototypes"]
    assert [r["step"] for r in refreshes] == [4, 8, 12, 16]
    assert all(r["refresh_seconds"] >= r["kmeans_seconds"] >= 0 and r["prototypes"] == 8 for r in refreshes)

    ck = load_checkpoint(run / "last.pt")
    layers = [m for m in ck.model.modules() if isinstance(m, PrototypeAttention)]
    assert len(layers) == 2 and all(bool(m.proto_valid.all()) for m in layers)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 32, 32, generator=g)
    tokens = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 10, 4, 5]])
    with torch.no_grad():
        feats, mask = ck.model.visual(images)
        with_memory = ck.model(feats, mask, tokens)
        for m in layers:
            m.proto_valid.zero_()
        without = ck.model(feats, mask, tokens)
    assert (with_memory - without).abs().max() > 1e-3


@pytest.mark.slow
def test_pma_run_resumes_exactly_with_its_banks(world, tmp_path):
    cfg = tiny_config(world, model=TINY_PMA, prototypes=PROTOTYPES, schedule={"epochs": 2, "warmup": 5})
    Trainer(cfg, out=tmp_path / "a", progress=False).run()
    Trainer(cfg, out=tmp_path / "b", max_steps=6, progress=False).run()  # banks half full, one refresh done
    Trainer(cfg, out=tmp_path / "b", resume=True, progress=False).run()

    def losses(run):
        return [(r["step"], r["loss"]) for r in records(run) if r["kind"] == "train"]

    assert losses(tmp_path / "b") == losses(tmp_path / "a")
    a = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
