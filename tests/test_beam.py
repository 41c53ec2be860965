"""Greedy and beam search on hand-made step distributions."""

import numpy as np
import pytest

from edgecap.contract.beam import DecodeOptions, beam_search

BOS, EOS, PAD = 1, 2, 0


class TableStepper:
    """Log-probs depend only on the previous token: table[prev] -> distribution over 5 tokens."""

    def __init__(self, table):
        self.table = {k: np.log(np.asarray(v, dtype=np.float64)) for k, v in table.items()}
        self.calls = 0

    def __call__(self, tokens, t):
        self.calls += 1
        return np.stack([self.table[int(tok)] for tok in tokens])

    def reorder(self, rows):
        pass


# token ids: 0 pad, 1 bos, 2 eos, 3 "a", 4 "b"
TABLE = {
    BOS: [1e-9, 1e-9, 0.1, 0.5, 0.4],  # greedy picks a (0.5)
    3: [1e-9, 1e-9, 0.1, 0.45, 0.45],  # after a: nothing good
    4: [1e-9, 1e-9, 0.9, 0.05, 0.05],  # after b: EOS likely
    EOS: [1e-9, 1e-9, 1.0, 1e-9, 1e-9],
    PAD: [1e-9, 1e-9, 1.0, 1e-9, 1e-9],
}


def test_greedy_follows_the_argmax():
    hyp = beam_search(TableStepper(TABLE), 1, DecodeOptions(beam_size=1, max_len=3), BOS, EOS, PAD)
    # a (0.5) -> tie a/b at 0.45: lower id wins -> a -> a
    assert hyp.tokens[0, 0].tolist() == [3, 3, 3]
    assert hyp.lengths[0, 0] == 3


def test_beam_finds_the_better_sequence_greedy_misses():
    hyp = beam_search(TableStepper(TABLE), 1, DecodeOptions(beam_size=2, max_len=4), BOS, EOS, PAD)
    best = hyp.tokens[0, 0].tolist()
    assert best == [4, EOS, PAD, PAD]  # b, eos: 0.4 * 0.9 = 0.36 beats a-paths
    assert hyp.scores[0, 0] == pytest.approx(np.log(0.36))
    assert hyp.lengths[0, 0] == 2


def test_finished_beams_keep_their_score_and_search_stops():
    table = dict(TABLE)
    table[3] = [1e-9, 1e-9, 0.8, 0.1, 0.1]
    stepper = TableStepper(table)
    hyp = beam_search(stepper, 2, DecodeOptions(beam_size=2, max_len=10), BOS, EOS, PAD)
    assert hyp.tokens.shape == (2, 2, 10)
    assert stepper.calls < 10  # both beams ended with EOS before max_len
    assert np.all(hyp.scores[:, 0] >= hyp.scores[:, 1])


def test_forced_length_runs_every_step():
    stepper = TableStepper(TABLE)
    beam_search(stepper, 1, DecodeOptions(beam_size=2, max_len=6, stop_at_eos=False), BOS, EOS, PAD)
    assert stepper.calls == 6


def test_length_penalty_prefers_longer_captions():
    # "<eos>" alone: p=0.6, length 1.  "a a a a": p=0.4*0.9^3=0.29, length 4.
    # alpha=3: log(0.6)/1 = -0.51 < log(0.29)/((5+4)/6)^3 = -0.37, so the long caption wins.
    table = {
        BOS: [1e-9, 1e-9, 0.6, 0.4, 1e-9],
        3: [1e-9, 1e-9, 0.1, 0.9, 1e-9],
        EOS: [1e-9, 1e-9, 1.0, 1e-9, 1e-9],
    }
    # the third beam takes the best of the 1e-9 ties (the lowest id, PAD) and goes nowhere
    table.update({t: [1e-9, 1e-9, 1.0, 1e-9, 1e-9] for t in (PAD, BOS, 4)} | {BOS: table[BOS]})
    plain = beam_search(TableStepper(table), 1, DecodeOptions(beam_size=3, max_len=4), BOS, EOS, PAD)
    long = beam_search(TableStepper(table), 1, DecodeOptions(beam_size=3, max_len=4, length_penalty=3.0), BOS, EOS, PAD)
    assert plain.tokens[0, 0].tolist() == [EOS, PAD, PAD, PAD]
    assert long.tokens[0, 0].tolist() == [3, 3, 3, 3]


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="beam_size"):
        DecodeOptions(beam_size=0)


def reference_beam_search(table, batch, k, steps, eos):
    """The exhaustive search: rank all k * V continuations of every image (flat argsort, ties
    to the lower beam * V + token) — what per-row top-k plus k * k candidates must equal."""
    rows = batch * k
    scores = np.zeros((batch, k))
    scores[:, 1:] = -np.inf
    finished = np.zeros(rows, dtype=bool)
    tokens = np.full(rows, BOS, dtype=np.int64)
    history = np.zeros((batch, k, 0), dtype=np.int64)
    for t in range(steps):
        logp = table[t, tokens].astype(np.float64)
        logp[finished] = -np.inf
        logp[finished, eos] = 0.0
        vocab = logp.shape[1]
        cand = (scores.reshape(rows, 1) + logp).reshape(batch, k * vocab)
        pick = np.argsort(-cand, axis=1, kind="stable")[:, :k]
        scores = np.take_along_axis(cand, pick, axis=1)
        src, tok = pick // vocab, pick % vocab
        src_rows = ((np.arange(batch) * k)[:, None] + src).reshape(-1)
        history = np.concatenate([np.take_along_axis(history, src[:, :, None], axis=1), tok[:, :, None]], axis=2)
        finished = finished[src_rows] | (tok.reshape(-1) == eos)
        tokens = tok.reshape(-1)
    return history, scores


class TimeTableStepper:
    """log-probs from table[t, previous token]; optionally offers top_k like a bundle does."""

    def __init__(self, table, offer_top_k):
        self.table = table
        if offer_top_k:
            from edgecap.contract.beam import row_top_k

            self.top_k = lambda tokens, t, k: row_top_k(self(tokens, t), k)

    def __call__(self, tokens, t):
        return self.table[t, tokens]

    def reorder(self, rows):
        pass


@pytest.mark.parametrize("offer_top_k", [False, True])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_per_row_top_k_equals_the_exhaustive_search(k, offer_top_k):
    rng = np.random.default_rng(k)
    vocab, steps, batch = 40, 7, 3
    logits = rng.standard_normal((steps, vocab, vocab))
    logits = np.round(logits * 2) / 2  # coarse values: many exact ties, as int8 models give
    table = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)
    want_tokens, want_scores = reference_beam_search(table, batch, k, steps, EOS)
    hyp = beam_search(TimeTableStepper(table, offer_top_k), batch,
                      DecodeOptions(beam_size=k, max_len=steps), BOS, EOS, PAD)
    np.testing.assert_allclose(hyp.scores, want_scores, rtol=0, atol=1e-9)
    finished_early = (want_tokens == EOS).cumsum(-1) - (want_tokens == EOS) > 0
    np.testing.assert_array_equal(np.where(finished_early, -1, hyp.tokens), np.where(finished_early, -1, want_tokens))


def test_row_top_k_breaks_ties_to_the_lower_id():
    from edgecap.contract.beam import row_top_k

    logp = np.array([[0.0, -1.0, -1.0, -1.0, -2.0, -1.0]], dtype=np.float32)
    for _ in range(5):  # argpartition's pick among equal values varies with the layout
        vals, idx = row_top_k(logp, 3)
        assert idx.tolist() == [[0, 1, 2]] and vals.tolist() == [[0.0, -1.0, -1.0]]
        logp = logp[:, ::-1].copy()
        logp = logp[:, ::-1].copy()
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        row_top_k(logp, 7)
