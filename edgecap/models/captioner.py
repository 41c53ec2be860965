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
beams of an image consecutive), step 0-d int64, the cache tensors and the cross tensors of the
B images (with cross expanded to R rows every row is its own image). It returns the log-probs
and, per cache tensor, only what changed: the new slot of each layer or, for a tensor without
a slot axis, the whole new per-layer state.

Which tensors those are, where their batch and slot axes lie and which are per layer, each
family says once in `self.state`, an `edgecap.contract.state.StateDescription`; the methods
here, the exporter and the runtime read it from there.
"""

from __future__ import annotations

import torch
from torch import nn

from edgecap.contract.state import StateDescription
from edgecap.errors import EdgecapError
from edgecap.models.config import CaptionerConfig
from edgecap.models.registry import VISUAL


class CaptionModel(nn.Module):
    # Inputs `encode` takes after (feats, mask), batch first (RA-T: retrieved caption tokens).
    encode_extra_names: tuple[str, ...] = ()
    state: StateDescription  # set by each family's __init__
    # the export spec (edgecap.export.specs.EXPORT_SPECS) that exports this model
    export_spec = ""
    # whether d_model is split into n_heads attention heads (then it must divide evenly)
    splits_heads = True

    @classmethod
    def attention_parts(cls, cfg: CaptionerConfig) -> tuple:
        """(registry, name) of each attention variant the decoder builds from the config."""
        return ()

    @classmethod
    def layers_label(cls, cfg: CaptionerConfig) -> str:
        """The depth as `edgecap models` and docs/models.md show it."""
        return f"{cfg.enc_layers}+{cfg.dec_layers}"

    @classmethod
    def upgrade_v1_state(cls, cfg: CaptionerConfig, state: dict) -> None:
        """Add to a version-1 checkpoint's state dict what the decoder now stores and that file
        did not (edgecap.models.checkpoint)."""

    def __init__(self, cfg: CaptionerConfig):
        super().__init__()
        self.cfg = cfg
        self.visual = VISUAL.get(cfg.visual.kind)(cfg)

    @property
    def cache_names(self) -> tuple[str, ...]:
        return self.state.cache_names

    @property
    def cross_names(self) -> tuple[str, ...]:
        return self.state.cross_names

    @property
    def cross_batch_axes(self) -> tuple[int, ...]:
        """Per cross tensor, its batch axis in the model's (layer-stacked) tensor."""
        return tuple(t.model_axis(t.batch_axis) for t in self.state.cross)

    def describe(self) -> dict[str, str]:
        """`edgecap models`' columns: the layers, and what the family adds ("-" for nothing)."""
        raise NotImplementedError

    def encode(self, feats: torch.Tensor, mask: torch.Tensor, *extra: torch.Tensor) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def encode_extra_example(self, batch: int) -> tuple[torch.Tensor, ...]:
        """Example extra `encode` inputs for `batch` images (export dummies, tests)."""
        return ()

    def check_extra(self, extra) -> None:
        if len(extra) != len(self.encode_extra_names):
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
        return tuple(t.repeat_interleave(repeats, dim=a) for t, a in zip(cross, self.cross_batch_axes, strict=True))

    def write_cache(self, cache, new, step: int):
        """Put a step's new values into the cache: slot `step` of each slotted field (in place
        unless autograd is recording), the whole state of the others."""
        out = []
        for tensor, values, described in zip(cache, new, self.state.cache, strict=True):
            values = torch.stack(tuple(values))
            axis = described.model_axis(described.slot_axis)
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
        return tuple(t.index_select(d.model_axis(d.batch_axis), rows) for t, d in zip(cache, self.state.cache, strict=True))

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
