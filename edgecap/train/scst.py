"""Self-critical sequence training (Rennie et al. 2017) with CIDEr-D rewards.

Per image, the k sequences of a beam search of width k (the shared numpy search in
`edgecap.contract.beam`, driven by `CachedStepper` over the static cache, without gradients)
are scored with CIDEr-D against the image's references. The baseline is the mean reward of the
k beams (the M2 / SMArT variant) or the reward of the greedy caption (`greedy`).

Two details follow the M2 code (`train.py`, `train_scst`), which SMArT and PMA-Net train with:
- document frequencies: M2 builds its reward scorer from the flat list of training captions,
  so each caption, not each image, is one document (df counts captions, N is the number of
  captions); `reward_scorer` builds the same;
- the log-probability term: M2 averages the search's per-token log-probs over all `max_len`
  positions, zeros after EOS, i.e. the sum up to and including EOS divided by `max_len` (not
  by the sequence's length), so a longer caption's advantage weighs more.

The search runs without autograd in eval mode (M2 searches in train mode, with dropout, and
back-propagates through the search); the log-probabilities that carry the gradient come from
one teacher-forced pass over the chosen sequences in train mode (through the DDP module), so
the search never builds a graph and picks the beams the deployed model would. Then

    loss = -mean_{images, beams} (reward - baseline) * sum_{t <= EOS} logp(token_t) / max_len
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from edgecap.contract.beam import DecodeOptions, Hypotheses, beam_search
from edgecap.contract.vocab import Vocab
from edgecap.metrics.ciderd import CiderD
from edgecap.models.captioner import CaptionModel
from edgecap.models.decoding import CachedStepper


def reward_scorer(train_refs: list[list[str]]) -> CiderD:
    """The SCST reward's CIDEr-D: document frequencies over the training captions, each caption
    one document, as the M2 code's `Cider(PTBTokenizer.tokenize(ref_caps_train))` has them."""
    return CiderD([[caption] for refs in train_refs for caption in refs])


@dataclass
class SCSTStats:
    reward: float  # mean CIDEr-D of the sampled sequences
    baseline: float  # mean baseline
    reward_seconds: float  # time spent scoring
    search_seconds: float  # time spent in beam search


class SCST:
    def __init__(self, model: CaptionModel, vocab: Vocab, cider, refs: list[list[str]],
                 beam_size: int = 5, baseline: str = "mean", max_len: int | None = None):
        """refs[i]: the reference strings of training image i (dataset index)."""
        if baseline not in ("mean", "greedy"):
            raise ValueError(f"baseline {baseline!r}, expected 'mean' or 'greedy'")
        self.model, self.vocab, self.cider, self.refs = model, vocab, cider, refs
        self.k, self.baseline = beam_size, baseline
        self.max_len = max_len or model.cfg.max_len

    @torch.no_grad()
    def search(self, inputs, mask, beams: int, extra: tuple = ()) -> Hypotheses:
        model = self.model
        was_training = model.training
        model.eval()
        try:
            feats, fmask = model.visual(inputs, mask)
            cross = model.encode(feats, fmask, *extra)
            batch = feats.shape[0]
            stepper = CachedStepper(model, cross, batch * beams)
            cfg = model.cfg
            return beam_search(stepper, batch, DecodeOptions(beam_size=beams, max_len=self.max_len),
                               cfg.bos_id, cfg.eos_id, cfg.pad_id)
        finally:
            model.train(was_training)

    def captions(self, tokens: np.ndarray) -> list[str]:
        return [" ".join(self.vocab.decode(row)) for row in tokens]

    def rewards(self, tokens: np.ndarray, indices) -> np.ndarray:
        """CIDEr-D of tokens [B, K, T] against the references of dataset items `indices` -> [B, K]."""
        b, k = tokens.shape[:2]
        cands = self.captions(tokens.reshape(b * k, -1))
        refs = [self.refs[int(i)] for i in indices for _ in range(k)]
        _, scores = self.cider.score(cands, refs)
        return scores.reshape(b, k)

    def loss(self, module: nn.Module, batch, hooks=None) -> tuple[torch.Tensor, SCSTStats]:
        cfg = self.model.cfg
        t0 = time.perf_counter()
        hyps = self.search(batch.inputs, batch.mask, self.k, batch.extra)
        greedy = self.search(batch.inputs, batch.mask, 1, batch.extra) if self.baseline == "greedy" else None
        t1 = time.perf_counter()
        indices = batch.indices.tolist()
        reward = self.rewards(hyps.tokens, indices)
        if greedy is not None:
            base = np.repeat(self.rewards(greedy.tokens, indices), self.k, axis=1)
        else:
            base = np.repeat(reward.mean(axis=1, keepdims=True), self.k, axis=1)
        t2 = time.perf_counter()

        device = batch.inputs.device
        b, k, steps = hyps.tokens.shape
        seqs = torch.from_numpy(hyps.tokens.reshape(b * k, steps)).to(device)
        lengths = torch.from_numpy(hyps.lengths.reshape(b * k)).to(device)
        # Valid output positions by length, not by token id: a sampled token may be anything.
        valid = torch.arange(steps, device=device)[None, :] < lengths[:, None]
        bos = torch.full((b * k, 1), cfg.bos_id, dtype=torch.long, device=device)
        dec_in = torch.cat([bos, seqs[:, :-1]], dim=1)
        owner = torch.arange(b, device=device).repeat_interleave(k)
        if hooks is not None:  # the training hooks hear which positions the forward pass trains
            hooks.before_forward(valid)
        logprobs = module(batch.inputs, batch.mask, dec_in, owner, *batch.extra)
        token_lp = logprobs.gather(-1, seqs.unsqueeze(-1)).squeeze(-1) * valid
        seq_lp = token_lp.sum(1) / steps  # M2: the mean over all max_len positions, zeros after EOS
        advantage = torch.from_numpy((reward - base).reshape(-1)).to(device=device, dtype=seq_lp.dtype)
        loss = -(advantage * seq_lp).mean()
        stats = SCSTStats(float(reward.mean()), float(base.mean()), t2 - t1, t1 - t0)
        return loss, stats
