"""PyTorch decoding: adapters that let the shared numpy search (contract/beam.py) drive a model.

`CachedStepper` runs `model.step` against the static cache (what the exported graph does);
`PrefixStepper` re-runs the decoder over the whole prefix each step, as many research
codebases do (the `torch-nocache` benchmark backend and a cross-check in tests).
"""

from __future__ import annotations

import numpy as np
import torch

from edgecap.contract.beam import DecodeOptions, Hypotheses, beam_search, settle_top_k
from edgecap.models.captioner import CaptionModel


class CachedStepper:
    """`rows` = images * beams rows over the cross state of the images (read once per image)."""

    def __init__(self, model: CaptionModel, cross, rows: int):
        self.model = model
        self.cross = cross
        self.cache = model.init_cache(rows)
        self.device = self.cache[0].device

    @torch.no_grad()
    def compute(self, tokens: np.ndarray, t: int):
        """The model's step: -> (log-probs, the new cache slots)."""
        token = torch.from_numpy(tokens).to(self.device)
        step = torch.tensor(t, dtype=torch.long, device=self.device)
        return self.model.step(token, step, self.cache, self.cross)

    @torch.no_grad()
    def write(self, new, t: int) -> None:
        self.cache = self.model.write_cache(self.cache, new, t)

    def _step(self, tokens: np.ndarray, t: int) -> torch.Tensor:
        logprobs, new = self.compute(tokens, t)
        self.write(new, t)
        return logprobs.float()

    def __call__(self, tokens: np.ndarray, t: int) -> np.ndarray:
        return self._step(tokens, t).cpu().numpy()

    def top_k(self, tokens: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """torch.topk (threaded, no copy of [R, V] to numpy first), then the contract's order."""
        logprobs = self._step(tokens, t)
        vals, idx = torch.topk(logprobs, k, dim=1)
        return settle_top_k(logprobs.cpu().numpy(), vals.cpu().numpy(), idx.cpu().numpy())

    def reorder(self, rows: np.ndarray) -> None:
        self.cache = self.model.reorder_cache(self.cache, torch.from_numpy(rows).to(self.device))


class PrefixStepper:
    """Encodes once, then re-runs the decoder over the whole prefix at every step."""

    def __init__(self, model: CaptionModel, cross, rows: int, repeats: int):
        self.model = model
        self.cross = model.expand_cross(cross, repeats)
        self.prefix = torch.empty(rows, 0, dtype=torch.long, device=cross[0].device)

    @torch.no_grad()
    def __call__(self, tokens: np.ndarray, t: int) -> np.ndarray:
        token = torch.from_numpy(tokens).to(self.prefix.device)
        self.prefix = torch.cat([self.prefix, token[:, None]], dim=1)
        return self.model.decode_prefix(self.cross, self.prefix)[:, -1].float().cpu().numpy()

    def reorder(self, rows: np.ndarray) -> None:
        self.prefix = self.prefix[torch.from_numpy(rows).to(self.prefix.device)]


@torch.no_grad()
def generate(
    model: CaptionModel,
    feats: torch.Tensor,
    mask: torch.Tensor,
    options: DecodeOptions | None = None,
    use_cache: bool = True,
    extra: tuple = (),
) -> Hypotheses:
    """Decode a batch of feature sequences with greedy (beam_size=1) or beam search.

    `extra`: the model's extra encode inputs (`model.encode_extra_names`), batch first."""
    cfg = model.cfg
    options = options or DecodeOptions(max_len=cfg.max_len)
    if options.max_len > cfg.max_len:
        raise ValueError(f"max_len={options.max_len} exceeds the model's static cache length {cfg.max_len}")
    batch, k = feats.shape[0], options.beam_size
    cross = model.encode(feats, mask, *extra)
    stepper = CachedStepper(model, cross, batch * k) if use_cache else PrefixStepper(model, cross, batch * k, k)
    return beam_search(stepper, batch, options, cfg.bos_id, cfg.eos_id, cfg.pad_id)
