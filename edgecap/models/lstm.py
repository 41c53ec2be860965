"""Up-Down captioner (Anderson et al., CVPR 2018): the LSTM baseline of the latency study.

An attention LSTM reads [h2, mean feature, word]; additive attention over the regions gives
the attended feature; a language LSTM reads [attended, h1] and predicts the word. The LSTM
state (h, c for both layers) is the decoding cache, so it exports like the Transformer step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from edgecap.contract.state import StateDescription, cache_tensor, cross_tensor
from edgecap.models.attention.base import MASK_VALUE
from edgecap.models.captioner import CaptionModel
from edgecap.models.registry import CONFIG_SECTIONS, DECODERS


@CONFIG_SECTIONS.register("lstm")
@dataclass
class LSTMConfig:
    """Up-Down (Anderson et al. 2018): attention LSTM + language LSTM."""

    hidden: int = 1000
    embed: int = 1000
    attention_hidden: int = 512


@DECODERS.register("lstm")
class UpDownCaptioner(CaptionModel):
    splits_heads = False  # no multi-head attention: d_model need not divide by n_heads
    # cache: per LSTM (attention, language) [B, hidden], replaced whole every step;
    # cross: feats [B, N, d], att_feats [B, N, a], mean_feat [B, d], enc_mask [B, N]
    STATE = StateDescription(
        cache=(cache_tensor("hidden", 0), cache_tensor("cell", 0)),
        cross=tuple(cross_tensor(name, 0) for name in ("feats", "att_feats", "mean_feat", "enc_mask")),
        layers=2,
    )

    export_spec = "lstm"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.state = self.STATE
        hid, emb, att, d = cfg.lstm.hidden, cfg.lstm.embed, cfg.lstm.attention_hidden, cfg.d_model
        self.feat_proj = nn.Sequential(nn.Linear(cfg.d_in, d), nn.ReLU(), nn.Dropout(cfg.dropout))
        self.word_emb = nn.Embedding(cfg.vocab_size, emb, padding_idx=cfg.pad_id)
        self.att_lstm = nn.LSTMCell(hid + d + emb, hid)
        self.lang_lstm = nn.LSTMCell(d + hid, hid)
        self.att_v = nn.Linear(d, att)
        self.att_h = nn.Linear(hid, att)
        self.att_w = nn.Linear(att, 1)
        self.dropout = nn.Dropout(cfg.dropout)
        self.fc = nn.Linear(hid, cfg.vocab_size)

    @classmethod
    def layers_label(cls, cfg) -> str:
        return "2 LSTM"

    def describe(self) -> dict[str, str]:
        return {"layers": self.layers_label(self.cfg), "memory": "-"}

    def encode(self, feats, mask, *extra):
        self.check_extra(extra)
        mask = mask.to(torch.bool)
        v = self.feat_proj(feats)  # [B, N, d]
        weights = mask.unsqueeze(-1).to(v.dtype)
        mean = (v * weights).sum(1) / weights.sum(1).clamp(min=1)
        return v, self.att_v(v), mean, mask

    def init_cache(self, batch: int):
        shape = (2, batch, self.cfg.lstm.hidden)
        device = self.fc.weight.device
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)

    def step(self, token, step, cache, cross):
        """token [R]; cache hidden, cell [2, R, hidden]; cross at batch B = R / beam (the beams
        of an image share its features) -> (log-probs [R, V], ((h1, h2), (c1, c2)))."""
        hidden, cell = cache
        v, att_feats, mean, mask = cross
        rows, images = token.shape[0], v.shape[0]
        beams = rows // images
        if beams > 1:
            mean = mean.repeat_interleave(beams, dim=0)
        h1, c1 = self.att_lstm(torch.cat([hidden[1], mean, self.word_emb(token)], -1), (hidden[0], cell[0]))
        query = self.att_h(h1).view(images, beams, 1, -1)
        scores = self.att_w(torch.tanh(att_feats.unsqueeze(1) + query)).squeeze(-1)  # [B, beams, N]
        alpha = torch.softmax(scores.masked_fill(~mask.unsqueeze(1), MASK_VALUE), dim=-1)
        attended = torch.bmm(alpha, v).reshape(rows, -1)
        h2, c2 = self.lang_lstm(torch.cat([attended, h1], -1), (hidden[1], cell[1]))
        logprobs = F.log_softmax(self.fc(self.dropout(h2)), dim=-1)
        return logprobs, ((h1, h2), (c1, c2))

    def decode_prefix(self, cross, tokens):
        return self.step_through(cross, tokens)  # recurrent: the prefix is the steps
