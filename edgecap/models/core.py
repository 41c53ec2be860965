"""The shared Transformer core: embeddings, masks, residuals, layer norms and feed-forward.

Post-layer-norm blocks as in the M2 Transformer code that SMArT and PMA-Net build on. The
attention blocks come from the registries, named by the config, so each family is a config
plus (at most) one attention module.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from edgecap.contract.state import StateDescription, cache_tensor, cross_tensor
from edgecap.errors import EdgecapError
from edgecap.models.captioner import CaptionModel
from edgecap.models.registry import (
    CROSS_ATTENTION,
    DECODER_SELF_ATTENTION,
    DECODERS,
    ENCODER_ATTENTION,
)


def sinusoid_table(length: int, d_model: int, zero_row: int | None = None) -> torch.Tensor:
    """[length, d] sinusoidal positions, sines in the first half and cosines in the second.

    The M2 code interleaves them (sin at even, cos at odd channels); models built here use the
    halves, and an imported M2 model carries the checkpoint's own table (`decoder_positions`)."""
    pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    dim = torch.arange(d_model // 2, dtype=torch.float32)
    angle = pos / torch.pow(10000.0, 2 * dim / d_model)
    table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)
    if zero_row is not None:
        table[zero_row] = 0
    return table


def decoder_positions(cfg) -> torch.Tensor:
    """The decoder position table a model is built with: [max_len + 1, d], row 0 the padding
    position (zero), step t reading row t + 1 as the M2 code does."""
    return sinusoid_table(cfg.max_len + 1, cfg.d_model, zero_row=0)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.dropout_inner = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x):
        out = self.fc2(self.dropout_inner(F.relu(self.fc1(x))))
        return self.norm(x + self.dropout(out))


class EncoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = ENCODER_ATTENTION.get(cfg.encoder_attention)(cfg.d_model, cfg.n_heads, cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)

    def forward(self, x, attn_mask, carry=None):
        att, carry = self.self_attn.encode_layer(x, attn_mask, carry)
        return self.ff(self.norm(x + self.dropout(att))), carry


class VisualEncoder(nn.Module):
    """features [B, N, D_in] + mask [B, N] -> every layer's output [n_layers, B, N, d]."""

    def __init__(self, cfg):
        super().__init__()
        self.fc_in = nn.Linear(cfg.d_in, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm_in = nn.LayerNorm(cfg.d_model)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.enc_layers))
        if cfg.encoder_positions == "sinusoidal":
            self.register_buffer("positions", sinusoid_table(cfg.n_regions, cfg.d_model), persistent=False)
        elif cfg.encoder_positions == "none":
            self.positions = None
        else:
            raise EdgecapError(
                f"encoder_positions={cfg.encoder_positions!r}, expected 'none' or 'sinusoidal'"
            )

    def forward(self, feats, mask):
        x = self.norm_in(self.dropout(F.relu(self.fc_in(feats))))
        if self.positions is not None:
            x = x + self.positions[: x.shape[1]]
        attn_mask = mask.to(torch.bool)[:, None, None, :]  # [B, 1, 1, N]
        levels, carry = [], None
        for layer in self.layers:
            x, carry = layer(x, attn_mask, carry)
            levels.append(x)
        return torch.stack(levels, dim=0)


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = DECODER_SELF_ATTENTION.get(cfg.decoder_self_attention)(cfg.d_model, cfg.n_heads, cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.cross = CROSS_ATTENTION.get(cfg.cross_attention)(cfg)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)

    def forward(self, x, causal_mask, cross_k, cross_v, enc_mask, side=(), carry=None):
        att, carry = self.self_attn.decode_prefix(x, causal_mask, side, carry)
        x = self.norm(x + self.dropout(att))
        return self.ff(self.cross(x, cross_k, cross_v, enc_mask)), carry

    def step(self, x, cache, step, cross_k, cross_v, enc_mask, side=(), carry=None):
        """cache: this layer's (k, v, *extra); returns (x, the new slot of each, carry)."""
        att, cache, carry = self.self_attn.decode_step(x, cache, step, side, carry)
        x = self.norm(x + self.dropout(att))
        return self.ff(self.cross(x, cross_k, cross_v, enc_mask)), cache, carry


@DECODERS.register("transformer")
class TransformerCaptioner(CaptionModel):
    # Per decoder layer: self-attention keys [R, H, dh, T] and values [R, H, T, dh] (keys
    # transposed, as attention reads them), one new slot per step.
    CACHE = (cache_tensor("self_k", 0, slot_axis=3), cache_tensor("self_v", 0, slot_axis=2))
    # cross_k [levels, B, H, dh, N], cross_v [levels, B, H, N, dh] per decoder layer; enc_mask [B, N]
    CROSS = (cross_tensor("cross_k", 1, per_layer=True), cross_tensor("cross_v", 1, per_layer=True),
             cross_tensor("enc_mask", 0))

    def __init__(self, cfg):
        super().__init__(cfg)
        self.encoder = VisualEncoder(cfg)
        self.word_emb = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        # A persistent buffer: fixed during training (as M2's frozen table) but saved, so a model
        # may carry a table other than the sinusoid. Official M2 checkpoints hold a random one:
        # M2's init_weights() runs Xavier over every >1-d parameter, its frozen table included.
        self.register_buffer("positions", decoder_positions(cfg))
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.dec_layers))
        self.fc = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.levels = self.layers[0].cross.levels_used(cfg) if cfg.dec_layers else 1
        # Plug points of the decoder self-attention variant (see attention/base.py): extra
        # encode inputs through a side encoder (-> the cross tensors it describes) and extra
        # per-layer cache tensors.
        attention = DECODER_SELF_ATTENTION.get(cfg.decoder_self_attention)
        self.side = attention.side_encoder(cfg)
        self.side_state = attention.cross_state if self.side is not None else ()
        self.state = StateDescription(cache=(*self.CACHE, *attention.cache_state),
                                      cross=(*self.CROSS, *self.side_state), layers=cfg.dec_layers)
        if self.side is not None:
            self.encode_extra_names = tuple(self.side.input_names)
        self.export_spec = attention.export_spec or "transformer"

    @classmethod
    def attention_parts(cls, cfg) -> tuple:
        return ((ENCODER_ATTENTION, cfg.encoder_attention), (DECODER_SELF_ATTENTION, cfg.decoder_self_attention),
                (CROSS_ATTENTION, cfg.cross_attention))

    @classmethod
    def upgrade_v1_state(cls, cfg, state: dict) -> None:
        """Version 1 never stored the position table: it was the sinusoid, rebuilt on load."""
        if "positions" not in state:
            state["positions"] = decoder_positions(cfg)

    def describe(self) -> dict[str, str]:
        cfg, parts = self.cfg, []
        for registry, name in self.attention_parts(cfg):
            part = registry.get(name).describe(cfg)
            if part and part not in parts:
                parts.append(part)
        return {"layers": self.layers_label(cfg), "memory": ", ".join(parts) or "-"}

    def encode_extra_example(self, batch: int):
        return () if self.side is None else self.side.example_inputs(batch, self.fc.weight.device)

    def encode(self, feats, mask, *extra):
        """-> cross_k, cross_v [L_dec, levels, B, H, N, dh], enc_mask [B, N] (bool), and with a
        side encoder side_k, side_v [L_dec, B, H, M, dh], side_mask [B, M] (bool)."""
        self.check_extra(extra)
        levels = self.encoder(feats, mask)
        ks, vs = zip(*(layer.cross.project(levels) for layer in self.layers), strict=False)
        cross = (torch.stack(ks), torch.stack(vs), mask.to(torch.bool))
        if self.side is None:
            return cross
        states, side_mask = self.side(*extra)
        sks, svs = zip(*(layer.self_attn.project_side(states) for layer in self.layers), strict=True)
        return (*cross, torch.stack(sks), torch.stack(svs), side_mask)

    def _side(self, cross, i):
        """Decoder layer i's share of the side encoder's cross tensors, in declared order."""
        if not self.side_state:
            return ()
        named = self.state.named("cross", cross)
        return tuple(named[t.name][i] if t.per_layer else named[t.name] for t in self.side_state)

    def init_cache(self, batch: int):
        cfg = self.cfg
        keys = (cfg.dec_layers, batch, cfg.n_heads, cfg.d_head, cfg.max_len)  # transposed, as attention reads them
        values = (cfg.dec_layers, batch, cfg.n_heads, cfg.max_len, cfg.d_head)
        device = self.fc.weight.device
        extra = [layer.self_attn.init_extra_cache(batch, cfg.max_len, device) for layer in self.layers]
        extra = tuple(torch.stack(ts) for ts in zip(*extra, strict=True))  # per field: [L, B, ...]
        return (torch.zeros(keys, device=device), torch.zeros(values, device=device), *extra)

    def embed(self, tokens, positions):
        return self.word_emb(tokens) + self.positions[positions]

    def step(self, token, step, cache, cross):
        """token [R]; cache per field [L, R, ...] (or a sequence of L per-layer tensors, as the
        exported graph takes them); cross at batch B = R / beam -> (log-probs [R, V], per
        cache field the L new slots [R, ..., 1, ...] to write at `step`)."""
        cross_k, cross_v, enc_mask = cross[:3]
        # [R, d]: one position per row and no length axis, so every linear layer of the step
        # is a 2-D matmul (a [R, 1, d] input wraps each in reshapes in onnxruntime's graph)
        x = self.embed(token, step + 1)
        new, carry = [], None
        for i, layer in enumerate(self.layers):
            mine = tuple(t[i] for t in cache)
            x, mine, carry = layer.step(x, mine, step, cross_k[i], cross_v[i], enc_mask, self._side(cross, i), carry)
            new.append(mine)
        logprobs = F.log_softmax(self.fc(x), dim=-1)
        return logprobs, tuple(zip(*new, strict=True))

    def decode_prefix(self, cross, tokens):
        """The whole prefix at once: tokens [B, L] (starting with BOS) -> log-probs [B, L, V]."""
        cross_k, cross_v, enc_mask = cross[:3]
        length = tokens.shape[1]
        positions = torch.arange(1, length + 1, device=tokens.device)
        x = self.embed(tokens, positions)
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()
        causal = causal[None, None]
        carry = None
        for i, layer in enumerate(self.layers):
            x, carry = layer(x, causal, cross_k[i], cross_v[i], enc_mask, self._side(cross, i), carry)
        return F.log_softmax(self.fc(x), dim=-1)
