"""Official M2 Transformer checkpoints -> the `m2` family, checked against the official computation.

The test builds a state dict the way the official code does: the modules with the official
names, shapes and their own initialisation (the decoder's position table a frozen sinusoid),
then `Transformer.init_weights()` (Xavier over every parameter with more than one dimension,
which overwrites that frozen table), then a stand-in for training that moves only trainable
parameters. It saves it the way M2's train.py does and compares our imported model with a small
re-implementation of the official forward pass written from the paper and the reference code's
structure (memory slots appended after the keys, the mask inferred from post-LayerNorm sums,
the checkpoint's own position table, gates fc_alpha1..3, sum / sqrt(3), padding multiplied out).
"""

import json
import math
import pickle
import random
import shutil
import sys
import types
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from edgecap.errors import EdgecapError
from edgecap.models.checkpoint import load_checkpoint
from edgecap.models.m2_import import import_m2, map_key, read_m2_checkpoint, read_m2_vocab

D, H, D_FF, D_IN, SLOTS, N_ENC, N_DEC, TABLE_LEN = 32, 4, 64, 24, 5, 3, 3, 54
ITOS = ["<unk>", "<pad>", "<bos>", "<eos>", "a", "man", "dog", "on", "the", "red", "table", "with"]
PAD, BOS, EOS = 1, 2, 3
POS_KEY = "decoder.pos_emb.weight"


def m2_table(length, d):
    """The official positional table: sin at even channels, cos at odd ones, row 0 zero."""
    pos = torch.arange(length, dtype=torch.float32).view(-1, 1)
    dim = torch.arange(d // 2, dtype=torch.float32).view(1, -1)
    table = torch.zeros(length, d)
    table[:, ::2] = torch.sin(pos / 10000 ** (2 * dim / d))
    table[:, 1::2] = torch.cos(pos / 10000 ** (2 * dim / d))
    table[0] = 0
    return table


def _module(**children):
    module = nn.Module()
    for name, child in children.items():
        setattr(module, name, child)
    return module


def _attention(memory=False, stateful=False):
    """MultiHeadAttention: .attention (ScaledDotProductAttention[Memory]) and .layer_norm."""
    attention = _module(fc_q=nn.Linear(D, D), fc_k=nn.Linear(D, D), fc_v=nn.Linear(D, D), fc_o=nn.Linear(D, D))
    if memory:  # ScaledDotProductAttentionMemory.init_weights: normal(0, 1/d_k) and normal(0, 1/m)
        attention.m_k = nn.Parameter(torch.empty(1, SLOTS, D).normal_(0, 1 / (D // H)))
        attention.m_v = nn.Parameter(torch.empty(1, SLOTS, D).normal_(0, 1 / SLOTS))
    block = _module(attention=attention, layer_norm=nn.LayerNorm(D))
    if stateful:  # register_state: buffers of the stateful beam search
        block.register_buffer("running_keys", torch.zeros(0, D))
        block.register_buffer("running_values", torch.zeros(0, D))
    return block


def _pwff():
    return _module(fc1=nn.Linear(D, D_FF), fc2=nn.Linear(D_FF, D), layer_norm=nn.LayerNorm(D))


def official_model(vocab):
    """The official module tree (names, shapes, parameters vs buffers) as M2 constructs it."""
    encoder = _module(
        fc=nn.Linear(D_IN, D), layer_norm=nn.LayerNorm(D),
        layers=nn.ModuleList(_module(mhatt=_attention(memory=True), pwff=_pwff()) for _ in range(N_ENC)),
    )
    layers = nn.ModuleList(
        _module(self_att=_attention(stateful=True), enc_att=_attention(), pwff=_pwff(),
                **{f"fc_alpha{a}": nn.Linear(2 * D, D) for a in range(1, N_ENC + 1)})
        for _ in range(N_DEC)
    )
    decoder = _module(
        word_emb=nn.Embedding(vocab, D, padding_idx=PAD),
        pos_emb=nn.Embedding.from_pretrained(m2_table(TABLE_LEN + 1, D), freeze=True),
        layers=layers, fc=nn.Linear(D, vocab, bias=False),
    )
    decoder.register_buffer("running_mask_self_attention", torch.zeros(1, 1, 0, dtype=torch.uint8))
    decoder.register_buffer("running_seq", torch.zeros(1, dtype=torch.long))
    return _module(encoder=encoder, decoder=decoder)


def official_state(seed=0, vocab=None, train_scale=0.1):
    """An official-layout state dict made as the official code makes one (see the module doc)."""
    vocab = len(ITOS) if vocab is None else vocab
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = official_model(vocab)
        # Transformer.init_weights(): every parameter with more than one dimension, the frozen
        # position table (requires_grad=False, but a parameter) included.
        for p in model.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        # Training moves what has a gradient; the frozen table stays as init_weights() left it.
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * train_scale)
        return {k: v.clone() for k, v in model.state_dict().items()}


# --- the official computation, written from the paper / reference structure ---------------------

def ref_forward(s, feats, tokens):
    def lin(x, p):
        return F.linear(x, s[f"{p}.weight"], s.get(f"{p}.bias"))

    def ln(x, p):
        return F.layer_norm(x, (D,), s[f"{p}.weight"], s[f"{p}.bias"])

    def attn(q_in, kv_in, p, mask, memory=False):
        b, nq, nk, dk = q_in.shape[0], q_in.shape[1], kv_in.shape[1], D // H
        k_all, v_all = lin(kv_in, f"{p}.fc_k"), lin(kv_in, f"{p}.fc_v")
        if memory:  # memory slots appended after the input keys, scaled sqrt(d_k) / sqrt(m)
            m = s[f"{p}.m_k"].shape[1]
            k_all = torch.cat([k_all, math.sqrt(dk) * s[f"{p}.m_k"].expand(b, -1, -1)], 1)
            v_all = torch.cat([v_all, math.sqrt(m) * s[f"{p}.m_v"].expand(b, -1, -1)], 1)
        q = lin(q_in, f"{p}.fc_q").view(b, nq, H, dk).permute(0, 2, 1, 3)
        k = k_all.view(b, -1, H, dk).permute(0, 2, 3, 1)
        v = v_all.view(b, -1, H, dk).permute(0, 2, 1, 3)
        att = torch.matmul(q, k) / math.sqrt(dk)
        if mask is not None:
            att = torch.cat([att[..., :nk].masked_fill(mask, float("-inf")), att[..., nk:]], -1)
        out = torch.matmul(torch.softmax(att, -1), v).permute(0, 2, 1, 3).reshape(b, nq, D)
        return lin(out, f"{p}.fc_o")

    def pwff(x, p):
        return ln(x + lin(F.relu(lin(x, f"{p}.fc1")), f"{p}.fc2"), f"{p}.layer_norm")

    # encoder: the padding mask is inferred from the *post-LayerNorm* features summing to 0
    x = ln(F.relu(lin(feats, "encoder.fc")), "encoder.layer_norm")
    enc_mask = (x.sum(-1) == 0)[:, None, None, :]
    levels = []
    for i in range(N_ENC):
        p = f"encoder.layers.{i}"
        x = ln(x + attn(x, x, f"{p}.mhatt.attention", enc_mask, memory=True), f"{p}.mhatt.layer_norm")
        x = pwff(x, f"{p}.pwff")
        levels.append(x)

    b, length = tokens.shape
    pad = (tokens != PAD).unsqueeze(-1).float()
    self_mask = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)[None, None]
    self_mask = self_mask | (tokens == PAD)[:, None, None, :]
    seq = torch.arange(1, length + 1).expand(b, -1).masked_fill(tokens == PAD, 0)
    y = s["decoder.word_emb.weight"][tokens] + s["decoder.pos_emb.weight"][seq]
    for j in range(N_DEC):
        p = f"decoder.layers.{j}"
        sa = ln(y + attn(y, y, f"{p}.self_att.attention", self_mask), f"{p}.self_att.layer_norm") * pad
        total = 0
        for i, level in enumerate(levels):
            c = ln(sa + attn(sa, level, f"{p}.enc_att.attention", enc_mask), f"{p}.enc_att.layer_norm") * pad
            alpha = torch.sigmoid(lin(torch.cat([sa, c], -1), f"{p}.fc_alpha{i + 1}"))
            total = total + c * alpha
        y = pwff(total / math.sqrt(N_ENC) * pad, f"{p}.pwff") * pad
    return F.log_softmax(lin(y, "decoder.fc"), -1), enc_mask


# --- files in the official formats ----------------------------------------------------------------

def save_official(path, state):
    """As M2's train.py: rng states (numpy arrays included), epoch, scores, optimizer, weights."""
    torch.save(
        {
            "torch_rng_state": torch.get_rng_state(),
            "numpy_rng_state": np.random.get_state(),
            "random_rng_state": random.getstate(),
            "epoch": 27,
            "val_loss": 2.31,
            "val_cider": 1.21,
            "state_dict": state,
            "optimizer": {"state": {}, "param_groups": [{"lr": 5e-6, "betas": (0.9, 0.98), "params": [0, 1]}]},
            "patience": 0,
            "best_cider": 1.31,
            "use_rl": True,
        },
        path,
    )


def save_vocab_pickle(path, itos):
    """A pickled `data.vocab.Vocab` exactly as M2 stores it, made without M2's code installed."""
    data_mod, vocab_mod = types.ModuleType("data"), types.ModuleType("data.vocab")

    class Vocab:
        pass

    def _default_unk_index():
        return 0

    Vocab.__module__ = _default_unk_index.__module__ = "data.vocab"
    Vocab.__qualname__, _default_unk_index.__qualname__ = "Vocab", "_default_unk_index"
    vocab_mod.Vocab, vocab_mod._default_unk_index = Vocab, _default_unk_index
    saved = {name: sys.modules.get(name) for name in ("data", "data.vocab")}
    sys.modules.update({"data": data_mod, "data.vocab": vocab_mod})
    try:
        v = Vocab()
        v.freqs = Counter({w: 10 for w in itos[4:]})
        v.itos = list(itos)
        v.stoi = defaultdict(_default_unk_index, {w: i for i, w in enumerate(itos)})
        v.vectors = None
        path.write_bytes(pickle.dumps(v, protocol=3))
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


@pytest.fixture
def official(tmp_path):
    state = official_state()
    weights, vocab = tmp_path / "meshed_memory_transformer.pth", tmp_path / "vocab.pkl"
    save_official(weights, state)
    save_vocab_pickle(vocab, ITOS)
    return state, weights, vocab


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(2, 7, D_IN, generator=g)
    feats[0, 5:] = 0  # image 0 has 5 detections, zero-padded to 7 as M2's data field does
    tokens = torch.tensor([[BOS, 4, 5, 7, 8, 10], [BOS, 4, 6, 11, 9, 10]])
    return feats, tokens


# --- tests ------------------------------------------------------------------------------------------

def test_imported_model_reproduces_official_logprobs(official):
    torch.set_num_threads(1)
    state, weights, vocab = official
    model, voc, meta = import_m2(weights, vocab, n_heads=H, max_len=10, n_regions=7)
    feats, tokens = inputs()
    with torch.no_grad():
        ref, inferred_mask = ref_forward(state, feats, tokens)
        all_rows = torch.ones(feats.shape[:2], dtype=torch.bool)
        ours = model(feats, all_rows, tokens)
        stepped = model.forward_incremental(feats, all_rows, tokens)
    assert (ours - ref).abs().max() < 1e-4
    assert (stepped - ref).abs().max() < 1e-4
    assert ours.argmax(-1).equal(ref.argmax(-1))
    # The official mask test runs after fc/ReLU/LayerNorm: zero-padded regions are not masked...
    assert not inferred_mask.any()
    # ...so masking them (our default for padded features) gives a different model output.
    real_rows = feats.abs().sum(-1) > 0
    with torch.no_grad():
        masked = model(feats, real_rows, tokens)
    assert (masked[0] - ref[0]).abs().max() > 1e-3
    assert (masked[1] - ref[1]).abs().max() < 1e-4  # image 1 has no padding
    assert meta["encoder_mask"] == "all-rows" and meta["m2_epoch"] == 27 and meta["m2_best_cider"] == 1.31
    assert meta["position_table"] == "non-sinusoid"
    assert voc.itos == ITOS and (model.cfg.pad_id, model.cfg.bos_id, model.cfg.eos_id, model.cfg.unk_id) == (1, 2, 3, 0)


def test_official_position_table_is_kept_not_rebuilt(official):
    """init_weights() leaves a random table behind (row 0, the padding position, not zero); the
    imported model carries exactly its first max_len + 1 rows, and a sinusoid in its place gives
    another model."""
    state, weights, vocab = official
    table = state[POS_KEY]
    bound = math.sqrt(6 / sum(table.shape))  # Xavier-uniform over [55, d]
    assert table[0].abs().max() > 0 and table.abs().max() <= bound
    assert not torch.allclose(table, m2_table(TABLE_LEN + 1, D), atol=0.05)
    model, _, _ = import_m2(weights, vocab, n_heads=H, max_len=10, n_regions=7)
    assert torch.equal(model.positions, table[:11])
    feats, tokens = inputs()
    rebuilt = dict(state, **{POS_KEY: m2_table(TABLE_LEN + 1, D)})
    with torch.no_grad():
        ours = model(feats, torch.ones(feats.shape[:2], dtype=torch.bool), tokens)
        wrong, _ = ref_forward(rebuilt, feats, tokens)
    assert (ours - wrong).abs().max() > 0.05


def test_a_sinusoid_table_imports_as_well(tmp_path):
    """A state dict saved before init_weights() (or by code that kept the sinusoid)."""
    state = dict(official_state(seed=4), **{POS_KEY: m2_table(TABLE_LEN + 1, D)})
    weights, vocab = tmp_path / "m2.pth", tmp_path / "vocab.json"
    save_official(weights, state)
    vocab.write_text(json.dumps(ITOS))
    model, _, meta = import_m2(weights, vocab, n_heads=H, max_len=10, n_regions=7)
    feats, tokens = inputs(seed=5)
    with torch.no_grad():
        ref, _ = ref_forward(state, feats, tokens)
        ours = model(feats, torch.ones(feats.shape[:2], dtype=torch.bool), tokens)
    assert (ours - ref).abs().max() < 1e-4 and meta["position_table"] == "sinusoid"


def test_config_read_from_weights(official):
    _, weights, vocab = official
    model, _, _ = import_m2(weights, vocab, n_heads=H)
    cfg = model.cfg
    assert (cfg.family, cfg.d_model, cfg.d_in, cfg.d_ff, cfg.enc_layers, cfg.dec_layers) == ("m2", D, D_IN, D_FF, 3, 3)
    assert (cfg.memory.slots, cfg.vocab_size, cfg.n_regions, cfg.max_len) == (SLOTS, len(ITOS), 50, 20)
    assert cfg.encoder_attention == "memory" and cfg.cross_attention == "meshed"


def test_every_official_key_is_mapped_once():
    state = official_state()
    mapped = [map_key(k) for k in state]
    targets = [k for k in mapped if k is not None]
    assert len(targets) == len(set(targets))
    skipped = sorted(k for k, m in zip(state, mapped, strict=True) if m is None)
    assert map_key(POS_KEY) == "positions"
    assert skipped == sorted(
        ["decoder.running_mask_self_attention", "decoder.running_seq"]
        + [f"decoder.layers.{j}.self_att.running_{w}" for j in range(N_DEC) for w in ("keys", "values")]
    )
    assert map_key("decoder.layers.2.fc_alpha3.bias") == "layers.2.cross.gates.2.bias"
    assert map_key("encoder.layers.1.mhatt.attention.m_v") == "encoder.layers.1.self_attn.m_v"


def test_cli_writes_a_checkpoint_that_reproduces_the_official_model(official, tmp_path, run_cli):
    state, weights, vocab = official
    out = tmp_path / "m2.pt"
    code, stdout, stderr = run_cli("import-m2", "--weights", weights, "--vocab", vocab, "--out", out,
                                   "--heads", H, "--max-len", 12, "--regions", 7)
    assert code == 0, stderr
    assert "3+3 layers" in stdout and "5 memory slots" in stdout
    ckpt = load_checkpoint(out)
    feats, tokens = inputs(seed=3)
    with torch.no_grad():
        ref, _ = ref_forward(state, feats, tokens)
        ours = ckpt.model(feats, torch.ones(feats.shape[:2], dtype=torch.bool), tokens)
    assert (ours - ref).abs().max() < 1e-4
    assert ckpt.vocab.itos == ITOS and ckpt.meta["source"] == "aimagelab/meshed-memory-transformer"


def test_half_rounds_the_weights_but_keeps_the_official_position_table(official, tmp_path, run_cli):
    """--half stored the official (random, frozen) table as fp16 like every weight; the table is
    kept exactly, the rest is fp16 and still gives the official model's words."""
    state, weights, vocab = official
    out = tmp_path / "m2-half.pt"
    code, _, stderr = run_cli("import-m2", "--weights", weights, "--vocab", vocab, "--out", out,
                              "--heads", H, "--max-len", 10, "--regions", 7, "--half")
    assert code == 0, stderr
    stored = torch.load(out, weights_only=True)["state_dict"]
    assert stored["positions"].dtype == torch.float32 and torch.equal(stored["positions"], state[POS_KEY][:11])
    assert stored["fc.weight"].dtype == torch.float16
    feats, tokens = inputs(seed=3)
    with torch.no_grad():
        ref, _ = ref_forward(state, feats, tokens)
        ours = load_checkpoint(out).model(feats, torch.ones(feats.shape[:2], dtype=torch.bool), tokens)
    assert (ours - ref).abs().max() < 1e-2 and ours.argmax(-1).equal(ref.argmax(-1))


@pytest.mark.slow
def test_exported_bundle_reproduces_the_official_model(official, tmp_path, run_cli):
    """The checkpoint's table travels into the ONNX graphs: teacher-forced through the bundle's
    decoder step, the log-probabilities are the official ones, and its captions are PyTorch's."""
    from edgecap.runtime.session import Bundle
    from tests._export_util import export

    state, weights, vocab = official
    ckpt = tmp_path / "m2.pt"
    code, _, stderr = run_cli("import-m2", "--weights", weights, "--vocab", vocab, "--out", ckpt,
                              "--heads", H, "--max-len", 8, "--regions", 7)
    assert code == 0, stderr
    result = export(ckpt, tmp_path / "bundle")
    parity = result.manifest.parity["onnxruntime"]
    assert parity.passed and parity.greedy_identical == 1.0 and parity.beam_identical == 1.0
    bundle = Bundle.load(result.path)
    feats, tokens = inputs(seed=7)
    with torch.no_grad():
        ref, _ = ref_forward(state, feats, tokens)
    cross = bundle.encode(feats.numpy(), np.ones(feats.shape[:2], bool))
    step = bundle.stepper(cross, beam=1)
    stepped = np.stack([step(tokens[:, t].numpy(), t).copy() for t in range(tokens.shape[1])], axis=1)
    assert np.abs(stepped - ref.numpy()).max() < 1e-4


def test_vocab_formats(tmp_path):
    (tmp_path / "v.json").write_text('["<unk>", "<pad>", "<bos>", "<eos>", "cat"]')
    (tmp_path / "v.txt").write_text("<unk>\n<pad>\n<bos>\n<eos>\ncat\n")
    assert read_m2_vocab(tmp_path / "v.json") == read_m2_vocab(tmp_path / "v.txt") == ["<unk>", "<pad>", "<bos>", "<eos>", "cat"]
    (tmp_path / "bad.txt").write_text("a\nb\n")
    with pytest.raises(EdgecapError, match="lacks the special token '<pad>'"):
        read_m2_vocab(tmp_path / "bad.txt")


def test_vocab_pickle_with_foreign_globals_is_refused(tmp_path):
    # print("pwned") as pickle opcodes (GLOBAL, MARK, UNICODE, TUPLE, REDUCE, STOP), written out
    # rather than pickled from the live `print`: Ray, once a fleet test has imported it in this
    # process, replaces builtins.print with its own function, which would pickle under Ray's name
    path = tmp_path / "vocab.pkl"
    path.write_bytes(b"cbuiltins\nprint\n(Vpwned\ntR.")
    with pytest.raises(EdgecapError, match="builtins.print is not allowed"):
        read_m2_vocab(path)


def test_bad_inputs_name_the_problem(official, tmp_path):
    state, weights, vocab = official
    with pytest.raises(EdgecapError, match="does not exist"):
        import_m2(tmp_path / "nope.pth", vocab)
    (tmp_path / "short.json").write_text('["<unk>", "<pad>", "<bos>", "<eos>"]')
    with pytest.raises(EdgecapError, match="vocabulary has 4 words but the checkpoint's word_emb has 12 rows"):
        import_m2(weights, tmp_path / "short.json", n_heads=H)
    odd = dict(state, **{"decoder.layers.0.extra.weight": torch.zeros(1)})
    torch.save({"state_dict": odd}, tmp_path / "odd.pth")
    with pytest.raises(EdgecapError, match="unknown key 'decoder.layers.0.extra.weight'"):
        import_m2(tmp_path / "odd.pth", vocab, n_heads=H)
    with pytest.raises(EdgecapError, match="--heads 5 does not divide d_model=32"):
        import_m2(weights, vocab, n_heads=5)
    with pytest.raises(EdgecapError, match="pos_emb.weight has 55 rows, so captions of at most 54 tokens; max_len=60 needs 61"):
        import_m2(weights, vocab, n_heads=H, max_len=60)
    torch.save({"state_dict": {k: v for k, v in state.items() if k != "decoder.fc.weight"}}, tmp_path / "cut.pth")
    with pytest.raises(EdgecapError, match="cut.pth does not fill the m2 model: the weights lack tensor fc.weight"):
        import_m2(tmp_path / "cut.pth", vocab, n_heads=H)
    # A checkpoint holding arbitrary code is refused by the weights-only reader.
    torch.save({"state_dict": state, "hook": shutil.rmtree}, tmp_path / "unsafe.pth")
    with pytest.raises(EdgecapError, match="cannot be read safely"):
        read_m2_checkpoint(tmp_path / "unsafe.pth")


def test_cli_never_overwrites_a_file_that_is_not_an_edgecap_checkpoint(official, tmp_path, run_cli):
    _, weights, vocab = official
    before = weights.read_bytes()
    # the classic slip: --out naming the official weights themselves
    code, _, stderr = run_cli("import-m2", "--weights", weights, "--vocab", vocab, "--out", weights, "--heads", H)
    assert code == 1 and stderr.count("\n") == 1
    assert f"--out {weights} exists and is not an edgecap checkpoint; not overwriting it" in stderr
    assert weights.read_bytes() == before
    # an edgecap checkpoint there is replaced, as re-running a conversion should
    out = tmp_path / "m2.pt"
    for _ in range(2):
        code, _, stderr = run_cli("import-m2", "--weights", weights, "--vocab", vocab, "--out", out, "--heads", H)
        assert code == 0, stderr
