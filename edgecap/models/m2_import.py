"""Import checkpoints of the official M2 Transformer code (aimagelab/meshed-memory-transformer).

The official `meshed_memory_transformer.pth` is `torch.save({'state_dict': ..., 'epoch', ...,
'numpy_rng_state', 'optimizer', ...})`; its vocabulary is `vocab.pkl`, a pickled `data.vocab.Vocab`
(a copy of torchtext's) whose `itos` starts `<unk> <pad> <bos> <eos>`. Features are 2048-d
bottom-up detections, 50 regions, zero-padded. This module maps every weight onto the `m2`
family (`edgecap.models.build("m2")`): the key table is `key_map()` and docs/pretrained.md.

Two things about the official files are kept exactly as they are, not "corrected":
- positional table: the official `Transformer.init_weights()` runs `xavier_uniform_` over every
  parameter with more than one dimension, and the decoder's frozen sinusoid table
  (`nn.Embedding.from_pretrained(..., freeze=True)`) is one of them. So every checkpoint its
  `train.py` writes, the released one included, holds a random table (row 0 not zero) that
  stayed frozen through training. The imported model carries that table (edgecap's decoder
  table is a persistent buffer); rebuilding a sinusoid instead gives another model.
- padding: M2 infers the encoder mask as `sum(x) == 0` *after* fc/ReLU/LayerNorm, where a
  zero-padded region has become LN(ReLU(b)) and its sum is not 0, so the official model never
  masked its padded regions: it attends to them as ordinary tokens. Our encoder takes an
  explicit mask; to reproduce the official outputs give the imported model an all-True mask
  over the zero-padded 50 rows (`FeatureStore(..., mask_padding=False)`; the checkpoint's meta
  says `encoder_mask: "all-rows"`).
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import re
from pathlib import Path

import numpy as np
import torch

from edgecap.contract.vocab import Vocab
from edgecap.errors import EdgecapError
from edgecap.io import sha256_file
from edgecap.jsonio import read_bytes, read_json, read_text
from edgecap.models.checkpoint import check_finite, check_weights
from edgecap.models.core import sinusoid_table
from edgecap.models.factory import build_from_config, preset_config

SOURCE = "aimagelab/meshed-memory-transformer"
M2_SOURCE = (f"the official meshed_memory_transformer.pth and vocab.pkl are linked from the README "
             f"of {SOURCE} on GitHub (docs/pretrained.md)")
M2_SPECIALS = {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"}

# Buffers of M2's stateful decoding (`register_state`): decoding state, not weights.
_STATE_BUFFERS = re.compile(
    r"^(enc_output|mask_enc|decoder\.running_mask_self_attention|decoder\.running_seq|"
    r"decoder\.layers\.\d+\.self_att\.running_(keys|values))$"
)

# official key (regex) -> our key (template); order matters only for readability.
_RULES: list[tuple[str, str]] = [
    (r"encoder\.fc\.(weight|bias)", r"encoder.fc_in.\1"),
    (r"encoder\.layer_norm\.(weight|bias)", r"encoder.norm_in.\1"),
    (r"encoder\.layers\.(\d+)\.mhatt\.attention\.(fc_[qkvo])\.(weight|bias)", r"encoder.layers.\1.self_attn.\2.\3"),
    (r"encoder\.layers\.(\d+)\.mhatt\.attention\.(m_k|m_v)", r"encoder.layers.\1.self_attn.\2"),
    (r"encoder\.layers\.(\d+)\.mhatt\.layer_norm\.(weight|bias)", r"encoder.layers.\1.norm.\2"),
    (r"encoder\.layers\.(\d+)\.pwff\.(fc1|fc2)\.(weight|bias)", r"encoder.layers.\1.ff.\2.\3"),
    (r"encoder\.layers\.(\d+)\.pwff\.layer_norm\.(weight|bias)", r"encoder.layers.\1.ff.norm.\2"),
    (r"decoder\.word_emb\.weight", r"word_emb.weight"),
    (r"decoder\.layers\.(\d+)\.self_att\.attention\.(fc_[qkvo])\.(weight|bias)", r"layers.\1.self_attn.\2.\3"),
    (r"decoder\.layers\.(\d+)\.self_att\.layer_norm\.(weight|bias)", r"layers.\1.norm.\2"),
    (r"decoder\.layers\.(\d+)\.enc_att\.attention\.(fc_[qkvo])\.(weight|bias)", r"layers.\1.cross.attention.\2.\3"),
    (r"decoder\.layers\.(\d+)\.enc_att\.layer_norm\.(weight|bias)", r"layers.\1.cross.norm.\2"),
    (r"decoder\.layers\.(\d+)\.fc_alpha(\d+)\.(weight|bias)", None),  # gate i -> cross.gates.(i-1)
    (r"decoder\.layers\.(\d+)\.pwff\.(fc1|fc2)\.(weight|bias)", r"layers.\1.ff.\2.\3"),
    (r"decoder\.layers\.(\d+)\.pwff\.layer_norm\.(weight|bias)", r"layers.\1.ff.norm.\2"),
    (r"decoder\.fc\.weight", r"fc.weight"),
]
_COMPILED = [(re.compile(f"^{pattern}$"), template) for pattern, template in _RULES]
POS_KEY = "decoder.pos_emb.weight"


def map_key(key: str) -> str | None:
    """Our state-dict key for an official one; None for M2's decoding-state buffers."""
    if _STATE_BUFFERS.match(key):
        return None
    if key == POS_KEY:
        return "positions"  # cut to max_len + 1 rows by convert_state_dict
    for pattern, template in _COMPILED:
        m = pattern.match(key)
        if m:
            if template is None:
                return f"layers.{m.group(1)}.cross.gates.{int(m.group(2)) - 1}.{m.group(3)}"
            return m.expand(template)
    raise EdgecapError(f"M2 checkpoint: unknown key {key!r} (not a key of the official M2 model)")


# --- the positional table ------------------------------------------------------------------------

def m2_sinusoid(length: int, d_model: int) -> torch.Tensor:
    """The table M2 builds before init_weights() overwrites it: edgecap's sinusoid with the sines
    and cosines interleaved (sin at even channels, cos at odd ones), row 0 zero."""
    sines, cosines = sinusoid_table(length, d_model, zero_row=0).chunk(2, dim=1)
    return torch.stack([sines, cosines], dim=2).flatten(1)


def _check_table_rows(rows: int, length: int) -> None:
    if rows < length:
        raise EdgecapError(
            f"M2 checkpoint: {POS_KEY} has {rows} rows, so captions of at most {rows - 1} tokens; "
            f"max_len={length - 1} needs {length}"
        )


def position_table(state: dict, length: int) -> tuple[torch.Tensor, str]:
    """(the first `length` rows of the checkpoint's table, "sinusoid" or "non-sinusoid").

    "non-sinusoid" is what official checkpoints hold (see the module docstring); "sinusoid" is
    what a state dict saved before init_weights() would hold. Either way the table is kept.
    """
    table = _need(state, POS_KEY)
    if table.dim() != 2 or table.shape[1] != _need(state, "decoder.word_emb.weight").shape[1]:
        raise EdgecapError(f"M2 checkpoint: {POS_KEY} has shape {tuple(table.shape)}, expected [rows, d_model]")
    rows, d_model = table.shape
    _check_table_rows(rows, length)
    table = table[:length].detach().float().cpu().clone()
    kind = "sinusoid" if torch.allclose(table, m2_sinusoid(length, d_model), atol=1e-5) else "non-sinusoid"
    return table, kind


# --- reading the official files ------------------------------------------------------------------

def _numpy_safe_globals() -> list:
    """numpy globals in M2's checkpoint (its 'numpy_rng_state'): array reconstruction only."""
    reconstruct = np._core.multiarray._reconstruct if hasattr(np, "_core") else np.core.multiarray._reconstruct
    allowed = [
        reconstruct,
        (reconstruct, "numpy.core.multiarray._reconstruct"),
        (reconstruct, "numpy._core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
    ]
    allowed += [type(np.dtype(code)) for code in ("u4", "i4", "i8", "f4", "f8")]
    return allowed


def read_m2_checkpoint(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """-> (official state dict, scalar metadata such as epoch / best_cider)."""
    path = Path(path)
    if not path.is_file():
        raise EdgecapError(f"M2 checkpoint {path} does not exist; {M2_SOURCE}")
    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad or unsafe file
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if unsafe:
            reason = f"it references {unsafe.group(1)}, which a weights-only load does not allow"
        raise EdgecapError(f"M2 checkpoint {path} cannot be read safely: {reason[:200]}") from exc
    if isinstance(payload, dict) and isinstance(payload.get("state_dict"), dict):
        state, meta = payload["state_dict"], {
            k: v for k, v in payload.items() if isinstance(v, (int, float, str, bool)) and k != "state_dict"
        }
    elif isinstance(payload, dict) and any(str(k).startswith(("encoder.", "module.encoder.")) for k in payload):
        state, meta = payload, {}
    else:
        keys = list(payload)[:6] if isinstance(payload, dict) else type(payload).__name__
        raise EdgecapError(f"M2 checkpoint {path} holds no M2 state dict (found {keys})")
    state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}
    return state, meta


class _PickledVocab:
    """Stand-in for M2's `data.vocab.Vocab` / torchtext's legacy Vocab: attributes only."""


def _default_unk_index():
    return 0


class _VocabUnpickler(pickle.Unpickler):
    """Reads the legacy torchtext-style Vocab pickle without torchtext or M2's code, and
    refuses every other global (a pickle can otherwise run arbitrary code)."""

    _ALLOWED = {
        ("collections", "Counter"): collections.Counter,
        ("collections", "defaultdict"): collections.defaultdict,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("builtins", "int"): int,
        ("data.vocab", "Vocab"): _PickledVocab,
        ("data.vocab", "_default_unk_index"): _default_unk_index,
        ("torchtext.vocab", "Vocab"): _PickledVocab,
        ("torchtext.vocab", "_default_unk_index"): _default_unk_index,
    }

    def find_class(self, module, name):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a vocabulary pickle") from None


def read_m2_vocab(path: str | os.PathLike) -> list[str]:
    """The `itos` list of an M2 vocabulary: `vocab.pkl`, a JSON list (or {'itos': [...]}),
    or a text file with one token per line."""
    path = Path(path)
    if not path.is_file():
        raise EdgecapError(f"M2 vocabulary {path} does not exist; {M2_SOURCE}")
    where = f"M2 vocabulary {path}"
    if path.suffix == ".json":
        obj = read_json(path, where=where)
        itos = obj.get("itos") if isinstance(obj, dict) else obj
    elif path.suffix == ".txt":
        itos = read_text(path, where=where).splitlines()
    else:
        data = read_bytes(path, where=where)
        try:
            obj = _VocabUnpickler(io.BytesIO(data)).load()
        except Exception as exc:  # pickle's own messages can span lines
            reason = " ".join(str(exc).split())
            raise EdgecapError(
                f"M2 vocabulary {path} is not a readable vocab pickle ({reason}); "
                f"export its itos as a JSON list instead"
            ) from exc
        itos = getattr(obj, "itos", None) if not isinstance(obj, (list, dict)) else (
            obj.get("itos") if isinstance(obj, dict) else obj
        )
    if not isinstance(itos, list) or not itos or not all(isinstance(w, str) for w in itos):
        raise EdgecapError(f"M2 vocabulary {path}: expected a list of token strings (itos)")
    missing = [w for w in M2_SPECIALS.values() if w not in itos]
    if missing:
        raise EdgecapError(f"M2 vocabulary {path} lacks the special token {missing[0]!r}")
    return itos


# --- conversion -----------------------------------------------------------------------------------

def _count(state: dict, pattern: str) -> int:
    found = {int(m.group(1)) for k in state if (m := re.match(pattern, k))}
    if found and found != set(range(len(found))):
        raise EdgecapError(f"M2 checkpoint: layer indices {sorted(found)} are not contiguous")
    return len(found)


# the tensors whose shapes give the model's sizes, and the shape each must have
_SIZED = {"encoder.fc.weight": "[d_model, d_in]", "decoder.word_emb.weight": "[vocab, d_model]",
          POS_KEY: "[rows, d_model]"}


def _need(state: dict, key: str) -> torch.Tensor:
    if key not in state:
        raise EdgecapError(f"M2 checkpoint lacks {key!r}")
    tensor = state[key]
    if key in _SIZED and (not isinstance(tensor, torch.Tensor) or tensor.dim() != 2):
        shape = list(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise EdgecapError(f"M2 checkpoint: {key} has shape {shape}, expected {_SIZED[key]}")
    return tensor


def m2_config(state: dict, itos: list[str], n_heads: int = 8, max_len: int = 20, n_regions: int = 50):
    """The `m2` config that fits an official state dict (sizes read from the weights).

    The number of heads leaves no trace in the weight shapes (h * d_k = d_model): it must be
    given; the official model and `train.py` default use 8.
    """
    d_model, d_in = _need(state, "encoder.fc.weight").shape
    _check_table_rows(_need(state, POS_KEY).shape[0], max_len + 1)  # before a model that long is built
    enc_layers = _count(state, r"^encoder\.layers\.(\d+)\.")
    dec_layers = _count(state, r"^decoder\.layers\.(\d+)\.")
    if not enc_layers or not dec_layers:
        raise EdgecapError("M2 checkpoint has no encoder or decoder layers")
    d_ff = _need(state, "encoder.layers.0.pwff.fc1.weight").shape[0]
    dec_ff = _need(state, "decoder.layers.0.pwff.fc1.weight").shape[0]
    if dec_ff != d_ff:
        raise EdgecapError(f"M2 checkpoint: encoder d_ff={d_ff} but decoder d_ff={dec_ff}; edgecap shares one d_ff")
    vocab_size = _need(state, "decoder.word_emb.weight").shape[0]
    if vocab_size != len(itos):
        raise EdgecapError(f"M2 vocabulary has {len(itos)} words but the checkpoint's word_emb has {vocab_size} rows")
    gates = sum(1 for k in state if re.match(r"^decoder\.layers\.0\.fc_alpha\d+\.weight$", k))
    if gates != enc_layers:
        raise EdgecapError(f"M2 checkpoint: {gates} meshed gates per decoder layer but {enc_layers} encoder layers")
    slots = {tuple(v.shape) for k, v in state.items() if k.endswith("mhatt.attention.m_k")}
    if len(slots) > 1:
        raise EdgecapError(f"M2 checkpoint: memory slot shapes differ between layers: {sorted(slots)}")
    if d_model % n_heads:
        raise EdgecapError(f"--heads {n_heads} does not divide d_model={d_model}")
    stoi = {w: i for i, w in enumerate(itos)}
    overrides = dict(
        vocab_size=vocab_size,
        max_len=max_len,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        enc_layers=enc_layers,
        dec_layers=dec_layers,
        d_in=d_in,
        n_regions=n_regions,
        encoder_positions="none",
        encoder_attention="memory" if slots else "plain",
        memory={"slots": next(iter(slots))[1] if slots else 0},
        cross_attention="meshed",
        pad_id=stoi["<pad>"],
        bos_id=stoi["<bos>"],
        eos_id=stoi["<eos>"],
        unk_id=stoi["<unk>"],
    )
    return preset_config("m2", **overrides).replace(name="m2-official")


def convert_state_dict(state: dict, cfg) -> tuple[dict[str, torch.Tensor], str]:
    """-> (our state dict, position-table kind): official keys mapped one to one, the position
    table cut to the model's max_len + 1 rows."""
    out = {}
    for key, value in state.items():
        ours = map_key(key)
        if ours is not None:
            out[ours] = value.detach().float().cpu()
    out["positions"], table_kind = position_table(state, cfg.max_len + 1)
    return out, table_kind


def import_m2(
    weights: str | os.PathLike,
    vocab: str | os.PathLike,
    n_heads: int = 8,
    max_len: int = 20,
    n_regions: int = 50,
):
    """-> (model in eval mode, Vocab, meta) from official M2 files."""
    state, extra = read_m2_checkpoint(weights)
    itos = read_m2_vocab(vocab)
    cfg = m2_config(state, itos, n_heads=n_heads, max_len=max_len, n_regions=n_regions)
    model = build_from_config(cfg)
    converted, table_kind = convert_state_dict(state, cfg)
    check_finite(converted, f"M2 checkpoint {weights}", "refusing to import weights that are not finite "
                 "(a diverged or damaged training run)")
    check_weights(model.state_dict(), converted, f"M2 checkpoint {weights} does not fill the m2 model",
                  "it is not a complete official M2 state dict")
    model.load_state_dict(converted)
    model.eval()
    meta = {
        "source": SOURCE,
        "weights": str(weights),
        "weights_sha256": sha256_file(weights),
        "vocab": str(vocab),
        "n_heads": n_heads,
        "encoder_mask": "all-rows",
        "position_table": table_kind,
        "note": "the official model attends to its zero-padded regions; feed mask=all True (see docs/pretrained.md)",
        **{f"m2_{k}": v for k, v in extra.items()},
    }
    return model, Vocab(list(itos), dict(M2_SPECIALS)), meta
