"""Beam search against the official M² code's algorithm (aimagelab/meshed-memory-transformer,
models/beam_search/beam_search.py), re-implemented here independently of edgecap's search:
beam x vocab candidates sorted per image, the first step expanding one beam, a finished beam
extended by token 0 at zero cost and every other token at score - 999 (the mask is applied
from the step after EOS), per-token log-probs zeroed after EOS, a final sort by summed
log-probability and `max_len` steps counting generated tokens (EOS included, BOS not).

Both edgecap paths are compared: the torch-free search (`edgecap.contract.beam`, what the
runtime runs) on log-prob tables, and the PyTorch decoder (`generate`) on small models.

The official M² code's beam search (benchmarks/_official_m2.py), the reference of issue 12's
"x the official code" ratios: it must caption exactly as edgecap's decoding does on the same
weights, or the ratio compares different work.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edgecap.contract.beam import DecodeOptions, beam_search
from edgecap.models.decoding import generate
from tests._export_util import tiny_model
from tests.conftest import random_batch
from tests.test_models import tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _official_m2 import OfficialM2Decoding, supports  # noqa: E402

BOS, EOS, PAD = 1, 2, 0


def m2_beam_search(word_logprobs, b_s: int, beam: int, max_len: int, eos: int):
    """The official loop. word_logprobs(t, prefix [rows, t] of generated tokens) -> [rows, V].

    Returns (tokens [b_s, beam, max_len], scores [b_s, beam], per-token log-probs [b_s, beam, max_len]),
    best first, as `BeamSearch.apply(..., out_size=beam)` does."""
    seq_mask = torch.ones(b_s, beam, 1, dtype=torch.float64)
    seq_logprob = torch.zeros(b_s, 1, 1, dtype=torch.float64)
    outputs, log_probs, words = [], [], None
    prefix = torch.zeros(b_s, 0, dtype=torch.long)
    for t in range(max_len):
        cur = 1 if t == 0 else beam
        word_lp = word_logprobs(t, prefix).to(torch.float64).view(b_s, cur, -1)
        vocab = word_lp.shape[-1]
        cand = seq_logprob + word_lp
        if t > 0:
            seq_mask = seq_mask * (words.view(b_s, cur) != eos).to(torch.float64).unsqueeze(-1)
            word_lp = word_lp * seq_mask.expand_as(word_lp)
            old = seq_logprob.expand_as(cand).contiguous()
            old[:, :, 1:] = -999
            cand = seq_mask * cand + old * (1 - seq_mask)
        # stable: among equal scores the lower beam * V + token first (edgecap's documented tie rule)
        sel_lp, sel_idx = torch.sort(cand.view(b_s, -1), dim=-1, descending=True, stable=True)
        sel_lp, sel_idx = sel_lp[:, :beam], sel_idx[:, :beam]
        sel_beam, words = sel_idx // vocab, sel_idx % vocab
        seq_logprob = sel_lp.unsqueeze(-1)
        seq_mask = torch.gather(seq_mask, 1, sel_beam.unsqueeze(-1))
        outputs = [torch.gather(o, 1, sel_beam.unsqueeze(-1)) for o in outputs] + [words.unsqueeze(-1)]
        this = torch.gather(word_lp, 1, sel_beam.unsqueeze(-1).expand(b_s, beam, vocab))
        log_probs = [torch.gather(o, 1, sel_beam.unsqueeze(-1)) for o in log_probs]
        log_probs.append(torch.gather(this, 2, words.unsqueeze(-1)))
        rows = (torch.arange(b_s)[:, None] * cur + sel_beam).reshape(-1)
        prefix = torch.cat([prefix[rows], words.reshape(-1, 1)], dim=1)
    scores, order = torch.sort(seq_logprob, 1, descending=True)
    tokens = torch.gather(torch.cat(outputs, -1), 1, order.expand(b_s, beam, max_len))
    lps = torch.gather(torch.cat(log_probs, -1), 1, order.expand(b_s, beam, max_len))
    return tokens.numpy(), scores.squeeze(-1).numpy(), lps.numpy()


def up_to_eos(tokens: np.ndarray, eos: int) -> np.ndarray:
    """Tokens after a sequence's first EOS set to -1 (the official code emits token 0 there, edgecap pad)."""
    after = np.cumsum(tokens == eos, axis=-1) - (tokens == eos) > 0
    return np.where(after, -1, tokens)


def assert_same_search(hyp, tokens, scores, lps, eos, atol):
    """atol: 1e-9 on float64 tables; on models the official side re-runs the whole prefix
    (float32 sums in another order than the static cache), so scores agree to ~1e-6."""
    np.testing.assert_array_equal(up_to_eos(hyp.tokens, eos), up_to_eos(tokens, eos))
    np.testing.assert_allclose(hyp.scores, scores, rtol=0, atol=atol)
    ended = (tokens == eos).any(-1)
    np.testing.assert_array_equal(hyp.lengths, np.where(ended, (tokens == eos).argmax(-1) + 1, tokens.shape[-1]))
    # the official per-token log-probs are zero after EOS and sum to the score
    np.testing.assert_allclose(lps.sum(-1), scores, rtol=0, atol=atol)


class TableStepper:
    def __init__(self, table):
        self.table = table

    def __call__(self, tokens, t):
        return self.table[t, tokens]

    def reorder(self, rows):
        pass


@pytest.mark.parametrize("seed", range(40))
def test_the_runtime_search_equals_the_official_algorithm_on_random_tables(seed):
    rng = np.random.default_rng(seed)
    vocab, steps, batch = int(rng.integers(6, 40)), int(rng.integers(2, 21)), int(rng.integers(1, 4))
    k = int(rng.integers(1, 6))
    logits = rng.standard_normal((steps, vocab, vocab)) * rng.uniform(0.5, 4)
    logits[..., EOS] += rng.uniform(-2, 3)  # from never ending to every beam ending early
    table = logits - np.log(np.exp(logits).sum(-1, keepdims=True))

    def official_step(t, prefix):
        prev = torch.full((prefix.shape[0],), BOS) if t == 0 else prefix[:, -1]
        return torch.from_numpy(table[t][prev.numpy()])

    tokens, scores, lps = m2_beam_search(official_step, batch, k, steps, EOS)
    hyp = beam_search(TableStepper(table), batch, DecodeOptions(beam_size=k, max_len=steps), BOS, EOS, PAD)
    assert_same_search(hyp, tokens, scores, lps, EOS, atol=1e-9)


@pytest.mark.parametrize("name", ["m2", "smart", "transformer", "updown"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_the_pytorch_decoder_equals_the_official_algorithm(name, k):
    model = tiny(name).eval()
    feats, mask, _ = random_batch(model, 3, 6, 1)[:3]
    cfg = model.cfg
    with torch.no_grad():
        cross = model.encode(feats, mask)

        def official_step(t, prefix):  # the whole prefix again, as the official stateful decoder sees it
            rows = prefix.shape[0]
            tokens = torch.cat([torch.full((rows, 1), cfg.bos_id), prefix], dim=1)
            return model.decode_prefix(model.expand_cross(cross, rows // feats.shape[0]), tokens)[:, -1]

        tokens, scores, lps = m2_beam_search(official_step, feats.shape[0], k, cfg.max_len, cfg.eos_id)
    hyp = generate(model, feats, mask, DecodeOptions(beam_size=k, max_len=cfg.max_len))
    assert_same_search(hyp, tokens, scores, lps, cfg.eos_id, atol=1e-4)


# -- the official M2 code itself (benchmarks/_official_m2.py) --------------------------------------
def cut(tokens: np.ndarray, eos: int) -> list[list[int]]:
    """Each caption up to and including its first EOS (the official code continues a finished
    beam with token 0, edgecap with padding)."""
    out = []
    for row in tokens.tolist():
        out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


def never_padding(model):
    """A trained captioner does not predict padding, a random tiny one does (and the official
    decoder masks a padding token where edgecap's does not): the last layer's output carries a
    constant 10 in channel 0, which every word's logit gets with weight 1 (the same shift for
    all, so their order is the model's) and padding's with weight -1."""
    with torch.no_grad():
        norm = model.layers[-1].ff.norm
        norm.weight[0], norm.bias[0] = 0.0, 10.0
        model.fc.weight[:, 0] = 1.0
        model.fc.weight[model.cfg.pad_id, 0] = -1.0
    return model


@pytest.mark.parametrize("beam", [1, 3, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_official_decoding_captions_as_edgecap_does(beam, seed):
    model = never_padding(tiny_model("m2", vocab_size=60, max_len=10))
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(4, cfg.n_regions, cfg.d_in, generator=g)
    mask = torch.ones(4, cfg.n_regions, dtype=torch.bool)
    mask[1, -2:] = False  # one image with padded regions: the encoder mask must reach every step
    official = OfficialM2Decoding(model, beam, cfg.max_len)
    official.encode(feats, mask)
    theirs = official.decode().numpy()
    ours = generate(model, feats, mask, DecodeOptions(beam_size=beam, max_len=cfg.max_len))
    assert theirs.shape == (4, cfg.max_len)
    assert cut(theirs, cfg.eos_id) == cut(ours.best(), cfg.eos_id)


def test_official_decoding_sees_the_encoder_mask():
    model = never_padding(tiny_model("m2", vocab_size=60, max_len=10))
    cfg = model.cfg
    feats = torch.randn(2, cfg.n_regions, cfg.d_in, generator=torch.Generator().manual_seed(5))
    full = torch.ones(2, cfg.n_regions, dtype=torch.bool)
    half = full.clone()
    half[:, cfg.n_regions // 2:] = False
    captions = []
    for mask in (full, half):
        official = OfficialM2Decoding(model, 3, cfg.max_len)
        official.encode(feats, mask)
        captions.append(official.decode().numpy())
    assert not np.array_equal(*captions)


@pytest.mark.parametrize("name", ["smart", "pma", "updown"])
def test_other_families_are_refused_in_one_line(name):
    model = tiny_model(name)
    reason = supports(model.cfg)
    assert reason and "\n" not in reason and name in reason
    with pytest.raises(ValueError, match="meshed cross-attention"):
        OfficialM2Decoding(model, 3, model.cfg.max_len)


def test_check_against_the_official_code_refuses_a_folder_that_is_not_its_checkout(tmp_path):
    # benchmarks/official_m2_check.py reads a user's checkout of the official code (none is in
    # this repository); a wrong folder is one line and exit 2, and nothing is written
    import subprocess

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "benchmarks" / "official_m2_check.py"),
                          "--code", str(tmp_path), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip() == (f"error: --code {tmp_path}: no utils/__init__.py; expected a checkout of "
                                  "aimagelab/meshed-memory-transformer")
    assert not out.exists()
