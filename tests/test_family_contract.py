"""The contract every family keeps, checked on every preset `list_models()` returns, at test
size: its state description matches the tensors it makes and survives the manifest's form;
incremental decoding through the static cache equals the whole prefix; cached greedy and beam
search equal search without a cache; reordering beams moves each cache tensor along the batch
axis the description gives; a few training steps lower the loss. A new preset is checked by
being there. (Bundles: tests/test_export_families.py, parametrised over the same list.)"""

import json

import pytest
import torch

from edgecap.contract.beam import DecodeOptions
from edgecap.contract.manifest import DecodingState
from edgecap.models import list_models
from edgecap.models.decoding import generate
from tests._export_util import tiny_model
from tests.conftest import random_batch, teacher_forcing_losses

FAMILIES = list_models()


def inputs(model, b=3, length=6, seed=1):
    """Seeded features, mask, BOS-started tokens and the family's own extra encode inputs."""
    feats, mask, tokens, _ = random_batch(model, b, length, seed)
    return feats, mask, tokens, tuple(model.encode_extra_example(b))


def test_every_family_is_checked():
    assert {"smart", "smart-nomem", "pma", "pma-edge", "m2", "transformer", "updown", "rat", "acf"} <= set(FAMILIES)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_state_description_matches_the_tensors(name):
    model = tiny_model(name)
    cfg, described = model.cfg, model.state
    rows, images = 6, 3
    cache = model.init_cache(rows)
    assert len(cache) == len(described.cache)
    for tensor, d in zip(cache, described.cache, strict=True):
        if d.per_layer:
            assert tensor.shape[0] == described.layers, d.name
        assert tensor.shape[d.model_axis(d.batch_axis)] == rows, d.name
        if d.slot_axis is not None:
            assert tensor.shape[d.model_axis(d.slot_axis)] == cfg.max_len, d.name
    feats, mask, _, extra = inputs(model, b=images)
    with torch.no_grad():
        cross = model.encode(feats, mask, *extra)
        assert len(cross) == len(described.cross)
        for tensor, d in zip(cross, described.cross, strict=True):
            if d.per_layer:
                assert tensor.shape[0] == described.layers, d.name
            assert tensor.shape[d.model_axis(d.batch_axis)] == images, d.name
        # the step returns per cache tensor one new slot (or, without a slot axis, the whole state)
        token = torch.full((rows,), cfg.bos_id, dtype=torch.long)
        _, new = model.step(token, torch.tensor(0), cache, cross)
    for tensor, values, d in zip(cache, new, described.cache, strict=True):
        shape = list(tensor.shape)
        if d.slot_axis is not None:
            shape[d.model_axis(d.slot_axis)] = 1
        assert list(torch.stack(tuple(values)).shape) == shape, d.name


@pytest.mark.parametrize("name", FAMILIES)
def test_the_state_description_round_trips_through_the_manifest(name):
    model = tiny_model(name)
    written = DecodingState.of(model.state, 2, model.encode_extra_names, update="cache_update").to_dict()
    read = DecodingState.from_dict(json.loads(json.dumps(written)), "manifest.json.state")
    assert (read.cache, read.cross, read.layers) == (model.state.cache, model.state.cross, model.state.layers)
    assert read.encode_extra_names == tuple(model.encode_extra_names) and read.top_k == 2
    assert read.update == "cache_update"
    # the graph names the exporter and the runtime derive from it: one per layer where per layer;
    # `cache_names` stays the model's names, as on the model's own description
    per_layer = [t.name for t in model.state.cache if t.per_layer]
    assert read.cache_graph_names[: model.state.layers] == [f"{per_layer[0]}.{i}" for i in range(model.state.layers)]
    assert read.cache_names == model.state.cache_names and read.cross_names == model.state.cross_names


@pytest.mark.parametrize("name", FAMILIES)
def test_incremental_decoding_equals_full_prefix(name):
    model = tiny_model(name)
    feats, mask, tokens, extra = inputs(model, length=model.cfg.max_len)
    with torch.no_grad():
        full = model(feats, mask, tokens, *extra)
        inc = model.forward_incremental(feats, mask, tokens, *extra)
    assert full.shape == (3, model.cfg.max_len, model.cfg.vocab_size)
    assert torch.isfinite(full).all()
    torch.testing.assert_close(inc, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_and_beam_agree_with_prefix_decoding(name):
    model = tiny_model(name)
    feats, mask, _, extra = inputs(model)
    for beam in (1, 3):
        opts = DecodeOptions(beam_size=beam, max_len=model.cfg.max_len)
        cached = generate(model, feats, mask, opts, extra=extra)
        prefix = generate(model, feats, mask, opts, use_cache=False, extra=extra)
        assert cached.tokens.shape == (3, beam, model.cfg.max_len)
        assert (cached.tokens == prefix.tokens).all()
        assert (cached.scores[:, :-1] >= cached.scores[:, 1:]).all()  # best first


@pytest.mark.parametrize("name", FAMILIES)
def test_reordering_beams_moves_each_cache_tensor_along_its_batch_axis(name):
    """Four beams of one image with different histories: a step on the reordered cache gives
    the reordered rows of a step on the cache as it was."""
    model = tiny_model(name)
    feats, mask, tokens, extra = inputs(model, b=1, length=4, seed=2)
    beams, t = 4, 3
    rows = torch.tensor([2, 0, 3, 3])
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        cross = model.encode(feats, mask, *extra)
        cache = model.init_cache(beams)
        history = torch.randint(4, model.cfg.vocab_size, (beams, t), generator=g)
        for step in range(t):
            _, new = model.step(history[:, step], torch.tensor(step), cache, cross)
            cache = model.write_cache(cache, new, step)
        token = torch.randint(4, model.cfg.vocab_size, (beams,), generator=g)
        before, _ = model.step(token, torch.tensor(t), cache, cross)
        after, _ = model.step(token[rows], torch.tensor(t), model.reorder_cache(cache, rows), cross)
    assert not torch.allclose(before[0], before[1])  # the beams differ, so a wrong move shows
    torch.testing.assert_close(after, before[rows], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_few_training_steps_reduce_the_loss(name):
    model = tiny_model(name).train()
    feats, mask, tokens, extra = inputs(model, b=4, length=7)
    losses = teacher_forcing_losses(model, feats, mask, tokens, 60, *extra)
    assert losses[-1] < 0.6 * losses[0], losses


def test_smart_matches_its_plain_pytorch_reading():
    """edgecap/models/smart_reference.py, the one-file SMArT, is the oracle for the core-built
    one: same weights, same log-probs over a prefix, same greedy caption."""
    from edgecap.models.smart_reference import SMArT

    model = tiny_model("smart")
    reference = SMArT.from_model(model)
    feats, mask, tokens, _ = inputs(model, length=model.cfg.max_len)
    with torch.no_grad():
        torch.testing.assert_close(reference(feats, mask, tokens), model(feats, mask, tokens), atol=1e-5, rtol=1e-5)
    found = generate(model, feats, mask, DecodeOptions(beam_size=1, max_len=model.cfg.max_len))
    assert reference.greedy(feats, mask).tolist() == found.tokens[:, 0].tolist()
    # the memory slots are read: without them the reading disagrees
    reference.encoder.layers[0].self_attn.slots = 0
    with torch.no_grad():
        assert not torch.allclose(reference(feats, mask, tokens), model(feats, mask, tokens), atol=1e-3)
