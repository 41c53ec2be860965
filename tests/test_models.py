"""Family-specific model checks: prototypes, memory slots, meshed gates, config errors, paper
sizes. What every family must do is tests/test_family_contract.py, over every preset."""

import pytest
import torch

from edgecap.errors import EdgecapError
from edgecap.models import build, preset_config
from tests.conftest import random_batch, tiny_overrides


def tiny(name, **extra):
    torch.manual_seed(0)
    return build(name, **{**tiny_overrides(name), **extra})


def batch(model, b=3, length=6, seed=1):
    return random_batch(model, b, length, seed)[:3]


def with_prototypes(model):
    for layer in model.layers:
        g = torch.Generator().manual_seed(3)
        d = model.cfg.d_model
        layer.self_attn.set_prototypes(torch.randn(4, d, generator=g), torch.randn(4, d, generator=g))
    return model


def test_prototypes_change_the_output_and_empty_set_is_plain_attention():
    model = tiny("pma-edge").eval()
    feats, mask, tokens = batch(model)
    with torch.no_grad():
        empty = model(feats, mask, tokens)
        with_prototypes(model)
        frozen = model(feats, mask, tokens)
    assert not torch.allclose(empty, frozen)
    assert int(model.layers[0].self_attn.proto_valid.sum()) == 4


def test_memory_slots_are_separate_key_and_value_parameters():
    model = tiny("smart")
    att = model.encoder.layers[0].self_attn
    assert att.m_k.shape == att.m_v.shape == (1, 40, 32)
    assert att.m_k is not att.m_v
    nomem = tiny("smart-nomem").encoder.layers[0].self_attn
    assert nomem.extra_kv() is None


def test_meshed_gates_follow_encoder_depth():
    model = tiny("m2", enc_layers=4)
    assert len(model.layers[0].cross.gates) == 4
    cross_k, _, _ = model.encode(*batch(model)[:2])
    assert cross_k.shape[:2] == (3, 4)  # decoder layers, encoder levels


def test_config_errors_name_the_field():
    with pytest.raises(EdgecapError, match="unknown field 'd_modle'.*did you mean 'd_model'"):
        build("smart", d_modle=8)
    with pytest.raises(EdgecapError, match="unknown model 'smrt'.*did you mean 'smart'"):
        build("smrt")
    with pytest.raises(EdgecapError, match="not divisible"):
        preset_config("smart", d_model=30, n_heads=4)
    with pytest.raises(EdgecapError, match="unknown encoder attention 'memroy'"):
        build("smart", encoder_attention="memroy", **tiny_overrides("smart"))


def test_paper_default_sizes():
    cfg = preset_config("smart")
    assert (cfg.enc_layers, cfg.dec_layers, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.memory.slots) == (2, 2, 512, 8, 2048, 40)
    assert preset_config("m2").cross_attention == "meshed"
    assert preset_config("transformer").enc_layers == 6
    assert preset_config("pma").prototype.count == 1024
