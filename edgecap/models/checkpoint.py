"""Model checkpoints: config + vocabulary + weights (with PMA prototypes) in one file.

    {"format": "edgecap-checkpoint", "format_version": 2, "config": cfg.to_dict(),
     "vocab": {"itos": [...], "specials": {...}}, "state_dict": {...}, "meta": {...}}

Written atomically (temp file, then rename). Loading uses `torch.load(weights_only=True)`, so
a checkpoint cannot run code; a corrupt or foreign file gives a one-line error.

Version 2 stores the Transformer decoder's position table (`positions`); version 1 did not
(the table was rebuilt as the sinusoid on load), so a version-1 file is read with exactly that
sinusoid put back and captions as it always did.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from edgecap.contract.vocab import Vocab
from edgecap.errors import EdgecapError
from edgecap.io import BUNDLE, atomic_path, probe_writable
from edgecap.models.captioner import CaptionModel
from edgecap.models.config import CaptionerConfig
from edgecap.models.factory import build_from_config
from edgecap.models.frontends import skeleton_front_ends
from edgecap.models.registry import DECODERS

FORMAT = "edgecap-checkpoint"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
FULL_PRECISION = ("positions",)  # tensors `half` keeps fp32


@dataclass
class Checkpoint:
    model: CaptionModel
    vocab: Vocab
    meta: dict = field(default_factory=dict)

    @property
    def config(self) -> CaptionerConfig:
        return self.model.cfg


def save_checkpoint(
    path: str | os.PathLike, model: CaptionModel, vocab: Vocab, meta: dict | None = None, half: bool = False
) -> Path:
    """Write a checkpoint atomically; `half` stores floating weights as fp16 (smaller files),
    except the decoder's position table: an imported M2 model's table is the official file's own
    (random, never trained) and costs a few kB, so it is kept exactly as read."""
    state = {
        k: (v.half() if half and v.is_floating_point() and k not in FULL_PRECISION else v).detach().cpu()
        for k, v in model.state_dict().items()
    }
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": model.cfg.to_dict(),
        "vocab": vocab.to_dict(),
        "state_dict": state,
        "meta": dict(meta or {}),
    }
    save_payload(payload, path)
    return Path(path)


def save_payload(payload: dict, path: str | os.PathLike) -> None:
    """torch.save `payload` to `path` atomically. Through a Python file object: given a path,
    torch writes with its own C++ writer, and a full disk surfaces as "RuntimeError: [enforce fail
    at inline_container.cc:672] . unexpected pos"; through the file it is the OSError (ENOSPC)
    that atomic_path turns into one line naming the file and the free space (torch's zip writer
    then fails again while closing; that RuntimeError hides the OSError, which is raised instead)."""
    with atomic_path(path, suffix=".pt") as tmp, open(tmp, "wb") as fh:
        try:
            torch.save(payload, fh)
        except RuntimeError as exc:
            if isinstance(exc.__context__, OSError):
                raise exc.__context__ from None
            raise


def check_weights(expected: dict, weights: dict, where: str, why: str, prefix: str = "") -> None:
    """Fail naming the first tensor where `weights` and a model's own state dict disagree
    (absent, extra, or another shape), instead of torch's multi-line load_state_dict error."""
    missing = [k for k in expected if k not in weights]
    if missing:
        raise EdgecapError(f"{where}: the weights lack tensor {prefix}{missing[0]} ({len(missing)} missing); {why}")
    unexpected = [k for k in weights if k not in expected]
    if unexpected:
        raise EdgecapError(f"{where}: the weights hold tensor {prefix}{unexpected[0]} that the model has no place for "
                           f"({len(unexpected)} unexpected); {why}")
    for name, tensor in expected.items():
        if tuple(weights[name].shape) != tuple(tensor.shape):
            raise EdgecapError(f"{where}: tensor {prefix}{name} has shape {list(weights[name].shape)} in the weights, "
                               f"the model's is {list(tensor.shape)}; {why}")


def check_finite(tensors: dict, where: str, why: str) -> None:
    """Fail naming the first floating-point tensor holding NaN or infinity: weights like that
    caption nothing (every score NaN) and would pass a parity gate that compares NaN with NaN."""
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            continue
        bad = ~torch.isfinite(tensor)
        if bool(bad.any()):
            nan = int(torch.isnan(tensor).sum())
            raise EdgecapError(f"{where}: tensor {name} holds {int(bad.sum())} non-finite values ({nan} NaN, "
                               f"{int(bad.sum()) - nan} infinite) of {tensor.numel()}; {why}")


def check_checkpoint_out(path: str | os.PathLike, flag: str = "--out") -> None:
    """Fail (one line) unless a checkpoint may be written at `path`: nothing there yet, or an
    edgecap checkpoint (which is replaced); never over any other file, e.g. the weights being
    converted."""
    path = Path(path)
    probe_writable(path, flag, file=True)
    if path.exists():
        try:
            read_payload(path)
        except EdgecapError:
            raise EdgecapError(f"{flag} {path} exists and is not an edgecap checkpoint; not overwriting it "
                               f"(choose another file name)") from None


def read_payload(path: str | os.PathLike) -> dict:
    path = Path(path)
    if path.is_dir():
        raise EdgecapError(f"checkpoint {path} is {_directory_kind(path)}")
    if not path.is_file():
        raise EdgecapError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgecapError(f"checkpoint {path} is not a readable PyTorch file: {reason[:160]}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        keys = list(payload)[:6] if isinstance(payload, dict) else type(payload).__name__
        hint = " (official M2 weights: use edgecap.models.m2_import)" if isinstance(payload, dict) and "state_dict" in payload else ""
        raise EdgecapError(f"checkpoint {path} is not an edgecap checkpoint (found {keys}){hint}")
    if payload.get("format_version") not in READABLE_VERSIONS:
        raise EdgecapError(
            f"checkpoint {path} has format_version {payload.get('format_version')!r}, "
            f"expected one of {', '.join(map(str, READABLE_VERSIONS))}"
        )
    for key in ("config", "vocab", "state_dict"):
        if key not in payload:
            raise EdgecapError(f"checkpoint {path} lacks the {key!r} entry")
    if payload["format_version"] == 1:
        _add_v1_positions(payload, path)
    return payload


def _directory_kind(path: Path) -> str:
    """What a directory given as a checkpoint is, and which file to name instead."""
    if BUNDLE.owns(path):
        return ("an exported bundle (ONNX graphs, no PyTorch weights), not a checkpoint: name the .pt it was "
                "exported from (a run directory's best.pt)")
    found = [name for name in ("best.pt", "last.pt") if (path / name).is_file()]
    hint = f": name a file in it, e.g. {path / found[0]}" if found else " (an edgecap .pt file)"
    return f"a directory, not a checkpoint{hint}"


def _add_v1_positions(payload: dict, path) -> None:
    """Version 1 never stored the decoder position table: every Transformer decoder then used
    the sinusoid, rebuilt on load. The decoder puts that table in, so v1 files load as they
    always did."""
    cfg = CaptionerConfig.from_dict(payload["config"], where=f"checkpoint {path}: config")
    DECODERS.get(cfg.decoder).upgrade_v1_state(cfg, payload["state_dict"])


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> Checkpoint:
    payload = read_payload(path)
    cfg = CaptionerConfig.from_dict(payload["config"], where=f"checkpoint {path}: config")
    vocab = Vocab.from_dict(payload["vocab"], where=f"checkpoint {path}: vocab")
    if len(vocab) != cfg.vocab_size:
        raise EdgecapError(f"checkpoint {path}: vocabulary has {len(vocab)} words but config.vocab_size={cfg.vocab_size}")

    with skeleton_front_ends():  # the state dict carries a front end's weights: no file, no init
        model = build_from_config(cfg)
    state = {k: v.float() if v.is_floating_point() else v for k, v in payload["state_dict"].items()}
    check_weights(model.state_dict(), state, f"checkpoint {path} is inconsistent",
                  f"its config ({cfg.name!r}: family {cfg.family}, d_model {cfg.d_model}) and its weights "
                  f"come from different models")
    model.load_state_dict(state)
    model.to(device).eval()
    return Checkpoint(model=model, vocab=vocab, meta=dict(payload.get("meta") or {}))
