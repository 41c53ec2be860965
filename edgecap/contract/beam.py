"""Greedy and beam search in numpy over any decoder step.

The one implementation used by the PyTorch decoder, the onnxruntime / TensorRT runtime and
SCST sampling, so their captions agree whenever their log-probabilities do.

A `Stepper` owns the decoding state (the static cache) for R = batch * beam rows:
    stepper(tokens [R] int64, t) -> log-probs [R, V]
    stepper.reorder(rows [R] int64)      # row i continues from old row rows[i]
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


def _top_k(cand: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k largest values and their indices; ties broken by the lower index."""
    if k < cand.shape[1]:
        idx = np.argpartition(-cand, k - 1, axis=1)[:, :k]
    else:
        idx = np.broadcast_to(np.arange(cand.shape[1]), cand.shape).copy()
    vals = np.take_along_axis(cand, idx, axis=1)
    order = np.lexsort((idx, -vals), axis=1)
    return np.take_along_axis(vals, order, axis=1), np.take_along_axis(idx, order, axis=1)


def length_normaliser(lengths: np.ndarray, alpha: float) -> np.ndarray:
    return ((5.0 + lengths) / 6.0) ** alpha


def beam_search(
    stepper: Stepper, batch: int, options: DecodeOptions, bos: int, eos: int, pad: int
) -> Hypotheses:
    k, steps = options.beam_size, options.max_len
    rows = batch * k
    tokens = np.full(rows, bos, dtype=np.int64)
    scores = np.zeros((batch, k), dtype=np.float64)
    scores[:, 1:] = -np.inf  # the first expansion comes from one beam only
    finished = np.zeros(rows, dtype=bool)
    out = np.full((batch, k, steps), pad, dtype=np.int64)
    lengths = np.full((batch, k), steps, dtype=np.int64)
    base = (np.arange(batch) * k)[:, None]
    for t in range(steps):
        logp = np.array(stepper(tokens, t), dtype=np.float64)
        vocab = logp.shape[1]
        if options.stop_at_eos and finished.any():
            logp[finished] = -np.inf
            logp[finished, eos] = 0.0
        cand = (scores.reshape(rows, 1) + logp).reshape(batch, k * vocab)
        scores, idx = _top_k(cand, k)
        src, tok = idx // vocab, idx % vocab
        src_rows = (base + src).reshape(-1)
        if k > 1:
            stepper.reorder(src_rows)
            out = np.take_along_axis(out, src[:, :, None], axis=1)
            lengths = np.take_along_axis(lengths, src, axis=1)
        was_finished = finished[src_rows].reshape(batch, k)
        out[:, :, t] = np.where(was_finished, pad, tok)
        tokens = tok.reshape(-1).astype(np.int64)
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
