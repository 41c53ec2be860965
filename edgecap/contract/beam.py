"""Greedy and beam search in numpy over any decoder step.

The one implementation used by the PyTorch decoder, the onnxruntime / TensorRT runtime and
SCST sampling, so their captions agree whenever their log-probabilities do.

A `Stepper` owns the decoding state (the static cache) for R = batch * beam rows:
    stepper(tokens [R] int64, t) -> log-probs [R, V]
    stepper.reorder(rows [R] int64)      # row i continues from old row rows[i]
and may also offer the k best tokens of every row directly (the bundle's step graph computes
them with a TopK node, far faster than numpy over [R, V]):
    stepper.top_k(tokens, t, k) -> (log-probs [R, k], token ids [R, k])  best first
Beam search needs only those: a candidate among the k best of its image is always among the
k best of its own beam, so each step ranks k * k candidates per image instead of k * V.
Ties go to the lower token id within a row and to the lower beam between rows (the order of
a flat argsort over beam * V + token).

Beam search keeps finished hypotheses in the beam: a finished row can only extend with EOS at
zero cost, so its score stays fixed (the M2 reference behaviour). With `length_penalty` alpha,
final hypotheses are ranked by score / ((5 + length) / 6) ** alpha (Wu et al., 2016); alpha = 0
ranks by summed log-probability. Greedy search is beam search with one beam.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Stepper(Protocol):
    def __call__(self, tokens: np.ndarray, t: int) -> np.ndarray: ...

    def reorder(self, rows: np.ndarray) -> None: ...


def row_top_k(logp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of every row of logp [R, V] and their column indices, best first;
    ties go to the lower index (what ONNX TopK guarantees, so both sides agree)."""
    vocab = logp.shape[1]
    if k > vocab:
        raise ValueError(f"beam size {k} exceeds the vocabulary ({vocab} tokens)")
    if k == 1:
        idx = np.argmax(logp, axis=1)[:, None]  # argmax returns the first maximum
        return np.take_along_axis(logp, idx, axis=1), idx
    idx = np.argpartition(logp, vocab - k, axis=1)[:, vocab - k:]
    return settle_top_k(logp, np.take_along_axis(logp, idx, axis=1), idx)


def settle_top_k(logp, vals: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Given some k largest entries per row (any order, any choice among equal values, e.g.
    from argpartition or torch.topk), -> the contract's choice and order: values descending,
    ties to the lower index. `logp` is the full [R, V] array the entries came from."""
    vals, idx = np.array(vals), np.array(idx, dtype=np.int64)
    kth = vals.min(axis=1, keepdims=True)
    tied = (np.asarray(logp == kth).sum(axis=1) > (vals == kth).sum(axis=1))
    for r in np.flatnonzero(tied):  # another entry equal to the k-th value has a lower id
        row = np.asarray(logp[r])
        order = np.lexsort((np.arange(row.size), -row))[: idx.shape[1]]
        idx[r], vals[r] = order, row[order]
    order = np.lexsort((idx, -vals), axis=1)
    return np.take_along_axis(vals, order, axis=1), np.take_along_axis(idx, order, axis=1)


@dataclass(frozen=True)
class DecodeOptions:
    beam_size: int = 1
    max_len: int = 20
    length_penalty: float = 0.0
    stop_at_eos: bool = True  # False: always run max_len steps (benchmarks)

    def __post_init__(self):
        if self.beam_size < 1:
            raise ValueError(f"beam_size={self.beam_size}, expected >= 1")
        if self.max_len < 1:
            raise ValueError(f"max_len={self.max_len}, expected >= 1")
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty={self.length_penalty}, expected a finite number")


@dataclass
class Hypotheses:
    """tokens [B, K, T] (pad after EOS, EOS included), scores [B, K] summed log-probs,
    lengths [B, K] tokens up to and including EOS; beams sorted best first."""

    tokens: np.ndarray
    scores: np.ndarray
    lengths: np.ndarray

    def best(self) -> np.ndarray:
        return self.tokens[:, 0]


def length_normaliser(lengths: np.ndarray, alpha: float) -> np.ndarray:
    return ((5.0 + lengths) / 6.0) ** alpha


def beam_search(
    stepper: Stepper, batch: int, options: DecodeOptions, bos: int, eos: int, pad: int
) -> Hypotheses:
    k, steps = options.beam_size, options.max_len
    rows = batch * k
    top_k = getattr(stepper, "top_k", None) or (lambda tokens, t, n: row_top_k(stepper(tokens, t), n))
    tokens = np.full(rows, bos, dtype=np.int64)
    scores = np.zeros((batch, k), dtype=np.float64)
    scores[:, 1:] = -np.inf  # the first expansion comes from one beam only
    finished = np.zeros(rows, dtype=bool)
    out = np.full((batch, k, steps), pad, dtype=np.int64)
    lengths = np.full((batch, k), steps, dtype=np.int64)
    base = (np.arange(batch) * k)[:, None]
    beam_of = np.repeat(np.arange(k), k)[None, :]  # the beam each of the k * k candidates extends
    for t in range(steps):
        vals, idx = top_k(tokens, t, k)
        vals = vals[:, :k].astype(np.float64)
        idx = idx[:, :k].astype(np.int64)
        if options.stop_at_eos and finished.any():
            vals[finished] = -np.inf
            vals[finished, 0], idx[finished, 0] = 0.0, eos
        cand = (scores.reshape(rows, 1) + vals).reshape(batch, k * k)
        cand_tok = idx.reshape(batch, k * k)
        pick = np.lexsort((cand_tok, np.broadcast_to(beam_of, cand.shape), -cand), axis=1)[:, :k]
        scores = np.take_along_axis(cand, pick, axis=1)
        tok = np.take_along_axis(cand_tok, pick, axis=1)
        src = pick // k
        src_rows = (base + src).reshape(-1)
        if k > 1:
            stepper.reorder(src_rows)
            out = np.take_along_axis(out, src[:, :, None], axis=1)
            lengths = np.take_along_axis(lengths, src, axis=1)
        was_finished = finished[src_rows].reshape(batch, k)
        out[:, :, t] = np.where(was_finished, pad, tok)
        tokens = tok.reshape(-1)
        if options.stop_at_eos:
            newly = ~was_finished & (tok == eos)
            lengths = np.where(newly, t + 1, lengths)
            finished = (was_finished | (tok == eos)).reshape(-1)
            if finished.all():
                break
    if options.length_penalty and k > 1:
        ranked = scores / length_normaliser(lengths, options.length_penalty)
        order = np.argsort(-ranked, axis=1, kind="stable")
        out = np.take_along_axis(out, order[:, :, None], axis=1)
        scores = np.take_along_axis(scores, order, axis=1)
        lengths = np.take_along_axis(lengths, order, axis=1)
    return Hypotheses(tokens=out, scores=scores, lengths=lengths)
