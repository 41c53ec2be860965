"""SCST: CIDEr-D rewards on beam-search samples, baselines, the policy-gradient direction, a run."""

import json

import numpy as np
import pytest
import torch
from _train_tiny import tiny_config
from conftest import tiny_overrides

from edgecap.contract.vocab import Vocab
from edgecap.data.datasets import Batch
from edgecap.metrics.ciderd import CiderD
from edgecap.models import build
from edgecap.train.loop import Trainer
from edgecap.train.scst import SCST, reward_scorer
from edgecap.train.xe import CaptionTrainModule

WORDS = ["a", "red", "mug", "blue", "bottle", "on", "the", "table", "next", "to", "laptop", "book"]


def setup(seed=0, beams=3, baseline="mean"):
    torch.manual_seed(seed)
    vocab = Vocab(["<pad>", "<bos>", "<eos>", "<unk>"] + WORDS)
    over = {**tiny_overrides("smart"), "vocab_size": len(vocab), "dropout": 0.0}
    model = build("smart", **over)
    g = torch.Generator().manual_seed(seed)
    batch = Batch(indices=torch.arange(3), inputs=torch.randn(3, 6, 24, generator=g),
                  mask=torch.ones(3, 6, dtype=torch.bool), tokens=torch.zeros(1, 1, dtype=torch.long),
                  owner=torch.zeros(1, dtype=torch.long))
    return model, vocab, batch


def seq_logprobs(model, scst, batch, tokens, lengths):
    """Mean token log-prob of each given sequence under the model (eval mode)."""
    model.eval()
    b, k, t = tokens.shape
    seqs = torch.from_numpy(tokens.reshape(b * k, t))
    dec_in = torch.cat([torch.ones(b * k, 1, dtype=torch.long), seqs[:, :-1]], 1)
    with torch.no_grad():
        lp = CaptionTrainModule(model)(batch.inputs, batch.mask, dec_in, torch.arange(b).repeat_interleave(k))
    valid = torch.arange(t)[None] < torch.from_numpy(lengths.reshape(-1))[:, None]
    tok = lp.gather(-1, seqs.unsqueeze(-1)).squeeze(-1) * valid
    return (tok.sum(1) / valid.sum(1)).reshape(b, k).numpy()


def test_rewards_are_cider_d_of_the_beams_against_each_images_references():
    model, vocab, batch = setup()
    refs = [["a red mug on the table", "a red mug next to a laptop"],
            ["a blue bottle on the table"], ["a book next to a laptop"]]
    cider = CiderD(refs)
    scst = SCST(model, vocab, cider, refs, beam_size=3)
    hyps = scst.search(batch.inputs, batch.mask, 3)
    assert hyps.tokens.shape[:2] == (3, 3)
    rewards = scst.rewards(hyps.tokens, [0, 1, 2])
    captions = scst.captions(hyps.tokens.reshape(9, -1))
    _, expected = cider.score(captions, [refs[i] for i in range(3) for _ in range(3)])
    assert np.allclose(rewards.reshape(-1), expected)
    # a candidate equal to a reference scores far above an unrelated one
    ids = np.array([[[vocab.stoi[w] for w in "a red mug on the table".split()] + [2]],
                    [[vocab.stoi[w] for w in "book book book book book book".split()] + [2]]])
    r = scst.rewards(ids, [0, 0])
    assert r[0, 0] > 1.0 > 0.1 > r[1, 0]


@pytest.mark.parametrize("baseline", ["mean", "greedy"])
def test_a_step_moves_probability_towards_the_rewarded_beam(baseline):
    model, vocab, batch = setup(beams=3)
    probe = SCST(model, vocab, CiderD([["a"]]), [["a"]] * 3, beam_size=3)
    hyps = probe.search(batch.inputs, batch.mask, 3)
    # make each image's second beam the reference: it gets the highest CIDEr-D
    refs = [[c] for c in probe.captions(hyps.tokens[:, 1])]
    corpus = refs + [["a book next to a laptop"], ["the table"]] * 10  # document frequencies
    scst = SCST(model, vocab, CiderD(corpus), refs, beam_size=3, baseline=baseline)
    before = seq_logprobs(model, scst, batch, hyps.tokens, hyps.lengths)
    reward = scst.rewards(hyps.tokens, [0, 1, 2])
    if baseline == "greedy":
        greedy = scst.search(batch.inputs, batch.mask, 1)
        advantage = reward - scst.rewards(greedy.tokens, [0, 1, 2])
    else:
        advantage = reward - reward.mean(1, keepdims=True)
    assert (reward[:, 1] == reward.max(1)).all()
    module = CaptionTrainModule(model)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss, stats = scst.loss(module, batch)
    assert stats.reward == pytest.approx(reward.mean())
    opt.zero_grad()
    loss.backward()
    opt.step()
    gain = seq_logprobs(model, scst, batch, hyps.tokens, hyps.lengths) - before
    # the step raises the advantage-weighted log-likelihood of the sampled beams ...
    assert (advantage * gain).sum() > 0
    if baseline == "mean":
        # ... and with advantages of both signs, the best beam of each image gains more than
        # the worst (a greedy baseline may leave every advantage >= 0: all beams go up)
        best, worst = advantage.argmax(1), advantage.argmin(1)
        rows = np.arange(3)
        assert (gain[rows, best] > gain[rows, worst]).all()


def test_equal_rewards_give_no_gradient_with_the_mean_baseline():
    model, vocab, batch = setup()
    refs = [["zzz"]] * 3  # no candidate can match: every reward is 0
    scst = SCST(model, vocab, CiderD(refs), refs, beam_size=3)
    loss, stats = scst.loss(CaptionTrainModule(model), batch)
    loss.backward()
    assert stats.reward == 0.0 and loss.item() == 0.0
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in model.parameters())


def test_scst_phase_starts_from_best_xe_and_changes_the_model(world, tmp_path):
    cfg = tiny_config(world, schedule={"epochs": 2, "warmup": 5},
                      scst={"epochs": 1, "beam_size": 3, "lr": 1e-3}, data={"val_batch_size": 4})
    run = tmp_path / "run"
    summary = Trainer(cfg, out=run, progress=False).run()
    assert summary["done"] and summary["best_scst_val_cider_d"] is not None
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    scst_lines = [r for r in records if r["kind"] == "train" and r["phase"] == "scst"]
    assert len(scst_lines) == 9 and all("reward" in r and "baseline" in r for r in scst_lines)
    assert any(r["kind"] == "phase" and r["phase"] == "scst" for r in records)
    xe = torch.load(run / "best_xe.pt", weights_only=True)["state_dict"]
    last = torch.load(run / "last.pt", weights_only=True)["state_dict"]
    assert any(not torch.equal(xe[k], last[k]) for k in xe)


def _package_a_tiny_run(world, tmp_path) -> dict:
    from edgecap.train.demo import package

    cfg = tiny_config(world, schedule={"epochs": 1, "warmup": 5}, scst={"epochs": 1, "beam_size": 2, "lr": 1e-3},
                      data={"val_batch_size": 4})
    Trainer(cfg, out=tmp_path / "run", progress=False).run()
    return package(tmp_path / "run", tmp_path / "assets", "tiny", coverage=False)


def test_packaging_a_finished_run_writes_an_fp16_asset_and_its_numbers(world, tmp_path):
    from edgecap.models.checkpoint import load_checkpoint

    metrics = _package_a_tiny_run(world, tmp_path)
    run = tmp_path / "run"
    for phase in ("xe", "scst"):
        for split in ("val", "test"):
            entry = metrics[phase][split]
            assert entry["images"] == 2 and 0 <= entry["cider_d_greedy"] <= 10 and "cider_d_beam3" in entry
    assert [r["phase"] for r in metrics["training_curve"]] == ["xe", "scst"]
    raw = torch.load(tmp_path / "assets" / "tiny.pt", weights_only=True)["state_dict"]
    assert all(v.dtype == torch.float16 for k, v in raw.items() if v.is_floating_point() and k != "positions")
    assert raw["positions"].dtype == torch.float32  # the position table is kept as it was
    ck = load_checkpoint(tmp_path / "assets" / "tiny.pt")
    best = load_checkpoint(run / "best.pt")
    key = "fc.weight"
    assert torch.allclose(ck.model.state_dict()[key], best.model.state_dict()[key], atol=1e-3)
    assert json.loads((tmp_path / "assets" / "tiny.metrics.json").read_text())["asset"]["from"] == "best.pt"
    # the world it was trained on travels with it: export's parity gate regenerates scenes of it
    assert ck.meta["train_config"]["data"]["synth"] == {"images": 40, "seed": 3, "size": 32,
                                                        "image_format": "jpg", "dir": str(world)}


def test_rescoring_the_asset_measures_it_again_by_todays_rule(world, tmp_path):
    """`python -m edgecap.train.demo --rescore WORLD`: the packaged asset's own CIDEr-D and box
    coverage, its weights untouched; entries measured under the earlier rule say so."""
    pytest.importorskip("spacy")
    from edgecap.train.demo import COVERAGE_RULE, EARLIER_RULE, main, rescore

    _package_a_tiny_run(world, tmp_path)
    assets = tmp_path / "assets"
    metrics_path = assets / "tiny.metrics.json"
    older = json.loads(metrics_path.read_text())
    older["xe"]["val"]["coverage_beam3"] = {">1%": 0.5}  # as packaged before the rule changed
    metrics_path.write_text(json.dumps(older))
    weights = (assets / "tiny.pt").read_bytes()
    metrics = rescore(world, assets, "tiny")
    assert (assets / "tiny.pt").read_bytes() == weights
    for split in ("val", "test"):
        entry = metrics["asset"][split]
        assert entry["images"] == 2 and entry["coverage_rule"] == COVERAGE_RULE
        assert set(entry["coverage_beam3"]) == {">1%", ">3%", ">5%", ">10%"} and "cider_d_greedy" in entry
    assert metrics["asset"]["from"] == "best.pt" and metrics["asset"]["eval_seconds"] > 0
    assert metrics["xe"]["val"]["coverage_rule"] == EARLIER_RULE
    assert json.loads(metrics_path.read_text()) == metrics
    other = tmp_path / "other"
    other.mkdir()
    assert main(["--rescore", str(other), "--out", str(assets), "--name", "tiny"]) == 1


def m2_cider_d(corpus: dict, gts: dict, res: dict) -> np.ndarray:
    """CIDEr-D as the M2 code's `Cider(corpus).compute_score(gts, res)` computes it
    (evaluation/cider/cider_scorer.py): df and log N from the corpus dict, one document per key."""
    from collections import Counter

    def grams(s):
        w = s.split()
        return Counter(tuple(w[i:i + n]) for n in range(1, 5) for i in range(len(w) - n + 1))

    df = Counter(g for refs in corpus.values() for g in {g for r in refs for g in grams(r)})
    log_n = np.log(float(len(corpus)))

    def vec(s):
        v, norm, length = [{} for _ in range(4)], np.zeros(4), 0
        for g, tf in grams(s).items():
            n = len(g) - 1
            v[n][g] = tf * (log_n - np.log(max(1.0, df[g])))
            norm[n] += v[n][g] ** 2
            length += tf if n == 1 else 0
        return v, np.sqrt(norm), length

    out = []
    for key in gts:
        vh, nh, lh = vec(res[key][0])
        total = np.zeros(4)
        for ref in gts[key]:
            vr, nr, lr = vec(ref)
            for n in range(4):
                val = sum(min(w, vr[n].get(g, 0.0)) * vr[n].get(g, 0.0) for g, w in vh[n].items())
                if nh[n] != 0 and nr[n] != 0:
                    val /= nh[n] * nr[n]
                total[n] += val * np.e ** (-((lh - lr) ** 2) / (2 * 6.0 ** 2))
        out.append(np.mean(total) / len(gts[key]) * 10.0)
    return np.array(out)


TRAIN_REFS = [["a red mug on the table", "a red mug next to a laptop", "the red mug"],
              ["a blue bottle on the table", "a bottle on a table"],
              ["a book next to a laptop", "a laptop and a book on the table"],
              ["a mug", "a red mug on a book"]]


def test_the_reward_counts_each_training_caption_as_a_document_as_m2_does():
    # M2: cider_train = Cider(PTBTokenizer.tokenize(list of every training caption))
    corpus = {i: [c] for i, c in enumerate(c for refs in TRAIN_REFS for c in refs)}
    cands = ["a red mug on the table", "a bottle on the table", "a laptop", "", "a red mug on a book"]
    items = [0, 1, 2, 3, 3]
    want = m2_cider_d(corpus, {i: TRAIN_REFS[j] for i, j in enumerate(items)}, {i: [c] for i, c in enumerate(cands)})
    _, got = reward_scorer(TRAIN_REFS).score(cands, [TRAIN_REFS[j] for j in items])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    # per-image documents (the COCO evaluation's df) give other rewards
    assert not np.allclose(CiderD(TRAIN_REFS).score(cands, [TRAIN_REFS[j] for j in items])[1], want)


def test_the_loss_is_m2s_sum_of_log_probs_over_max_len_times_the_advantage():
    model, vocab, batch = setup(seed=1)
    batch.indices = torch.tensor([0, 1, 2])
    scst = SCST(model, vocab, reward_scorer(TRAIN_REFS), TRAIN_REFS, beam_size=3)
    hyps = scst.search(batch.inputs, batch.mask, 3)
    b, k, steps = hyps.tokens.shape
    assert steps == model.cfg.max_len and hyps.lengths.min() < steps  # beams that end early
    # M2: outs, log_probs = beam_search(...); reward - mean(reward of the image's beams);
    # loss = mean(-mean(log_probs over the max_len positions, zero after EOS) * advantage)
    captions = scst.captions(hyps.tokens.reshape(b * k, -1))
    corpus = {i: [c] for i, c in enumerate(c for refs in TRAIN_REFS for c in refs)}
    reward = m2_cider_d(corpus, {i: TRAIN_REFS[i // k] for i in range(b * k)},
                        {i: [c] for i, c in enumerate(captions)}).reshape(b, k)
    model.eval()  # dropout is 0: the search's log-probs are the teacher-forced ones
    lp = seq_logprobs(model, scst, batch, hyps.tokens, hyps.lengths) * hyps.lengths  # summed up to EOS
    want = np.mean(-(lp / steps) * (reward - reward.mean(1, keepdims=True)))
    loss, stats = scst.loss(CaptionTrainModule(model), batch)
    assert stats.reward == pytest.approx(reward.mean(), rel=1e-9)
    assert loss.item() == pytest.approx(want, rel=1e-5, abs=1e-9)
