"""The interface every captioner implements; decoding, training and export use only this.

    feats, mask = model.visual(inputs)                 # images or precomputed features
    cross = model.encode(feats, mask, *extra)          # once per image; `extra` named by
                                                       # model.encode_extra_names (usually none)
    cache = model.init_cache(rows)                     # static: fixed shapes, zeros
    logprobs, new = model.step(token, step, cache, cross)
    cache = model.write_cache(cache, new, t)           # new slots into slot t (in place)
    logprobs = model(feats, mask, tokens, *extra)      # teacher forcing, whole prefix
    logprobs = model.decode_prefix(cross, tokens)      # the same, cross state given

`step` is exactly the exported decoder-step graph: token [R] int64 (R = B * beam rows, the
beams of an image consecutive), step 0-d int64, the cache tensors (layers on axis 0, rows on
axis 1) and the cross tensors of the B images (batch axis per `cross_batch_axes`; with cross
expanded to R rows every row is its own image). It returns the log-probs and, per cache
field, only what changed: the new slot of each layer (`cache_slot_axes` says where it goes)
or, for a field whose axis is None, the whole new per-layer state.
"""

from __future__ import annotations

import torch
from torch import nn

from edgecap.models.config import CaptionerConfig
from edgecap.models.registry import VISUAL


class Captioner(nn.Module):
    cache_names: tuple[str, ...] = ()
    cross_names: tuple[str, ...] = ()
    # Inputs `encode` takes after (feats, mask), batch first (RA-T: retrieved caption tokens).
    encode_extra_names: tuple[str, ...] = ()
    cache_batch_axis = 1
    # per cache field: the axis of its time slots (the step writes one), or None when the
    # step returns the field's whole new state
    cache_slot_axes: tuple[int | None, ...] = ()
    # per cross tensor: stacked per decoder layer on axis 0 (the export feeds layers apart)
    cross_layered: tuple[bool, ...] = ()

    def __init__(self, cfg: CaptionerConfig):
        super().__init__()
        self.cfg = cfg
        self.visual = VISUAL.get(cfg.visual.kind)(cfg)

    @property
    def cross_batch_axes(self) -> tuple[int, ...]:
        raise NotImplementedError

    def encode(self, feats: torch.Tensor, mask: torch.Tensor, *extra: torch.Tensor) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def encode_extra_example(self, batch: int) -> tuple[torch.Tensor, ...]:
        """Example extra `encode` inputs for `batch` images (export dummies, tests)."""
        return ()

    def check_extra(self, extra) -> None:
        if len(extra) != len(self.encode_extra_names):
            from edgecap.errors import EdgecapError

            names = ", ".join(self.encode_extra_names) or "none"
            raise EdgecapError(
                f"model {self.cfg.name!r} encode() takes {len(self.encode_extra_names)} extra "
                f"input(s) ({names}), got {len(extra)}"
            )

    def init_cache(self, batch: int) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def step(self, token, step, cache, cross):
        raise NotImplementedError

    def decode_prefix(self, cross, tokens):
        """Teacher forcing over a whole prefix given the cross state -> log-probs [B, L, V]."""
        raise NotImplementedError

    def forward(self, feats, mask, tokens, *extra):
        """Teacher forcing: tokens [B, L] (starting with BOS) -> log-probs [B, L, V]."""
        return self.decode_prefix(self.encode(feats, mask, *extra), tokens)

    def expand_cross(self, cross, repeats: int):
        """Repeat each image's cross state `repeats` times (one row per beam)."""
        if repeats == 1:
            return cross
        return tuple(t.repeat_interleave(repeats, dim=a) for t, a in zip(cross, self.cross_batch_axes, strict=False))

    def write_cache(self, cache, new, step: int):
        """Put a step's new values into the cache: slot `step` of each slotted field (in place
        unless autograd is recording), the whole state of the others."""
        out = []
        for tensor, values, axis in zip(cache, new, self.cache_slot_axes, strict=True):
            values = torch.stack(tuple(values))
            if axis is None:
                out.append(values)
            elif torch.is_grad_enabled():
                shape = [1] * tensor.dim()
                shape[axis] = -1
                hit = (torch.arange(tensor.shape[axis], device=tensor.device) == step).view(shape)
                out.append(torch.where(hit, values.to(tensor.dtype), tensor))
            else:
                tensor.narrow(axis, step, 1).copy_(values)
                out.append(tensor)
        return tuple(out)

    def reorder_cache(self, cache, rows: torch.Tensor):
        return tuple(t.index_select(self.cache_batch_axis, rows) for t in cache)

    def forward_incremental(self, feats, mask, tokens, *extra):
        """Teacher forcing one step at a time through the static cache (tests)."""
        return self.step_through(self.encode(feats, mask, *extra), tokens)

    def step_through(self, cross, tokens):
        """Run `step` over every position of tokens [B, L] -> log-probs [B, L, V]."""
        cache = self.init_cache(tokens.shape[0])
        out = []
        for t in range(tokens.shape[1]):
            logprobs, new = self.step(tokens[:, t], torch.tensor(t, dtype=torch.long), cache, cross)
            cache = self.write_cache(cache, new, t)
            out.append(logprobs)
        return torch.stack(out, dim=1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
