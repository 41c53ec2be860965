"""Pretrained weights, handled in one place: local files only, checked, with their preprocessing.

Nothing here downloads anything. A weights file is a path the user names; when a sha256 is
given the file must match it; the image preprocessing that goes with the weights (size,
mean/std, resize filter, channel order) travels with them as a `Preprocessing` record, so
training, feature extraction, export and the runtime normalise images the same way.

The `open_clip` visual front end returns the grid tokens of an open_clip ViT:
- tokens of the last transformer block **after** `ln_post` (the norm CLIP trained in front of
  its projection; the raw residual stream of large ViTs has a few outlier channels with huge
  magnitudes), **before** the projection, so D is the ViT width (768 for ViT-B, 1024 for
  ViT-L);
- the CLS token **excluded**: N = (image_size / patch_size)^2 is a square grid, like the `cnn`
  front end, so sinusoidal encoder positions apply; the captioner's attention can pool
  globally on its own;
- the mask is all True (every grid cell is real);
- the backbone is frozen (`requires_grad=False`): features are precomputed once, as PMA-Net
  does with CLIP ViT-L/14. Only the visual tower is kept; the text tower is dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edgecap.errors import EdgecapError, did_you_mean, require
from edgecap.models.registry import VISUAL

# open_clip's interpolation names -> the OpenCV filter names `contract.preprocess` accepts.
_RESIZE_NAMES = {"bicubic": "bicubic", "bilinear": "bilinear", "nearest": "nearest", "area": "area"}


@dataclass(frozen=True)
class Preprocessing:
    """How images must be prepared for a set of weights (see `contract.preprocess`)."""

    size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resize: str = "bicubic"
    channel_order: str = "RGB"

    def visual_overrides(self) -> dict:
        """The `visual.*` config fields that carry this preprocessing."""
        return {
            "image_size": self.size,
            "mean": tuple(self.mean),
            "std": tuple(self.std),
            "resize": self.resize,
            "channel_order": self.channel_order,
        }


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_weights(path: str | os.PathLike, sha256: str = "", what: str = "weights") -> Path:
    """The local weights file `path`, checked; never a download.

    Raises a one-line EdgecapError naming the path when it is empty, missing or not a file,
    or when `sha256` is given and the file's digest differs.
    """
    if not str(path or "").strip():
        raise EdgecapError(f"{what}: no weights file given (name a local file; nothing is downloaded)")
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise EdgecapError(f"{what} file {resolved} does not exist (weights are never downloaded: name a local file)")
    if not resolved.is_file():
        raise EdgecapError(f"{what} file {resolved} is not a file")
    if sha256:
        actual = sha256_file(resolved)
        if actual.lower() != sha256.strip().lower():
            raise EdgecapError(f"{what} file {resolved} has sha256 {actual}, expected {sha256.strip().lower()}")
    return resolved


def _open_clip_model_name(open_clip, backbone: str) -> str:
    """A built-in open_clip config name, or a path to a custom open_clip JSON config."""
    if not backbone:
        raise EdgecapError("open_clip: no backbone named (e.g. ViT-B-32, or a model config .json file)")
    if backbone.endswith(".json"):
        path = Path(backbone).expanduser()
        if not path.is_file():
            raise EdgecapError(f"open_clip model config {path} does not exist")
        open_clip.add_model_config(path)
        return path.stem
    names = open_clip.list_models()
    if backbone not in names:
        raise EdgecapError(
            f"unknown open_clip backbone {backbone!r}{did_you_mean(backbone, names)} "
            f"(built-in names from open_clip.list_models(), or a model config .json file)"
        )
    return backbone


@contextlib.contextmanager
def _quiet_root_warning(prefix: str):
    """Drop root-logger records starting with `prefix` (open_clip logs through `logging.warning`)."""
    root = logging.getLogger()
    drop = lambda record: not str(record.getMessage()).startswith(prefix)  # noqa: E731
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


def _read_state_dict(open_clip, path: Path) -> dict:
    from open_clip.factory import load_state_dict

    try:
        # open_clip's reader: torch.load(weights_only=True) or safetensors, unwraps
        # {'state_dict': ...} and DataParallel's 'module.' prefix.
        state = load_state_dict(str(path), weights_only=True)
    except Exception as exc:  # torch / safetensors raise many types for a bad file
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise EdgecapError(f"open_clip weights {path} are not a readable state dict: {reason[:160]}") from exc
    if not isinstance(state, dict) or not state:
        raise EdgecapError(f"open_clip weights {path} hold no state dict")
    return state


def load_open_clip_visual(
    backbone: str, weights: str | os.PathLike, sha256: str = "", device: str | torch.device = "cpu"
) -> tuple[nn.Module, Preprocessing]:
    """open_clip's visual tower for `backbone` with weights from the local file `weights`.

    The file may hold a whole CLIP state dict (`visual.*` keys, the text tower is ignored) or
    the visual tower alone. Returns the tower (eval mode) and its preprocessing.
    """
    open_clip = require("open_clip", "train", "open_clip visual front end")
    path = resolve_weights(weights, sha256, what="open_clip weights")
    name = _open_clip_model_name(open_clip, backbone)
    # pretrained=None and no tower defaults: open_clip must not fetch anything. Its warning
    # that the model is randomly initialised is wrong here: the weights are loaded below.
    with _quiet_root_warning("No pretrained weights loaded"):
        model = open_clip.create_model(name, pretrained=None, pretrained_image=False, pretrained_text=False)
    visual = model.visual
    if not hasattr(visual, "forward_intermediates") or not hasattr(visual, "patch_size"):
        raise EdgecapError(f"open_clip backbone {backbone!r} is not a ViT; grid tokens need a ViT visual tower")
    state = _read_state_dict(open_clip, path)
    if any(k.startswith("visual.") for k in state):
        state = {k[len("visual."):]: v for k, v in state.items() if k.startswith("visual.")}
    own = visual.state_dict()
    mismatch = [k for k, v in own.items() if k in state and tuple(state[k].shape) != tuple(v.shape)]
    if mismatch:
        k = mismatch[0]
        raise EdgecapError(
            f"open_clip weights {path} do not fit backbone {backbone!r}: {k} has shape "
            f"{tuple(state[k].shape)} in the file, {tuple(own[k].shape)} in the model"
        )
    missing, unexpected = visual.load_state_dict(state, strict=False)
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise EdgecapError(f"open_clip weights {path} do not fit backbone {backbone!r}: {what}")
    visual.to(device).eval()
    return visual, preprocessing_of(visual)


def preprocessing_of(visual: nn.Module) -> Preprocessing:
    """The preprocessing open_clip records for a visual tower."""
    cfg = dict(getattr(visual, "preprocess_cfg", {}) or {})
    size = cfg.get("size", getattr(visual, "image_size", 224))
    if isinstance(size, (tuple, list)):
        if len(set(size)) != 1:
            raise EdgecapError(f"open_clip image size {tuple(size)} is not square; edgecap preprocesses square images")
        size = size[0]
    mean = tuple(float(m) for m in cfg.get("mean", getattr(visual, "image_mean", (0.48145466, 0.4578275, 0.40821073))))
    std = tuple(float(s) for s in cfg.get("std", getattr(visual, "image_std", (0.26862954, 0.26130258, 0.27577711))))
    resize = _RESIZE_NAMES.get(str(cfg.get("interpolation", "bicubic")), "bicubic")
    return Preprocessing(size=int(size), mean=mean, std=std, resize=resize, channel_order="RGB")


def grid_shape(visual: nn.Module, size: int) -> tuple[int, int]:
    """(number of grid tokens, token width) of an open_clip ViT at `size` pixels."""
    patch = visual.patch_size
    patch = patch[0] if isinstance(patch, (tuple, list)) else patch
    return (size // patch) ** 2, int(visual.ln_post.normalized_shape[0])


@torch.no_grad()
def grid_tokens(visual: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """images [B, 3, H, W] (normalised) -> patch tokens of the last block after ln_post [B, N, D]."""
    out = visual.forward_intermediates(
        images, indices=1, normalize_intermediates=True, intermediates_only=True, output_fmt="NLC"
    )
    return out["image_intermediates"][-1]


@VISUAL.register("open_clip")
class OpenCLIPVisual(nn.Module):
    """Grid tokens of a frozen open_clip ViT loaded from `cfg.visual.weights` (a local file).

    The config must agree with the backbone: `visual.image_size`, `mean`, `std` equal the
    weights' preprocessing, `d_in` the ViT width and `n_regions` the grid size. A mismatch is
    an error naming both values (`openclip_overrides` gives the right ones).
    """

    takes_images = True

    def __init__(self, cfg):
        super().__init__()
        vc = cfg.visual
        self.backbone, self.preprocessing = load_open_clip_visual(vc.backbone, vc.weights, vc.weights_sha256)
        self.backbone.requires_grad_(False)
        n_tokens, width = grid_shape(self.backbone, self.preprocessing.size)
        expected = {
            "visual.image_size": (vc.image_size, self.preprocessing.size),
            "d_in": (cfg.d_in, width),
            "n_regions": (cfg.n_regions, n_tokens),
            "visual.mean": (tuple(round(m, 6) for m in vc.mean), tuple(round(m, 6) for m in self.preprocessing.mean)),
            "visual.std": (tuple(round(s, 6) for s in vc.std), tuple(round(s, 6) for s in self.preprocessing.std)),
        }
        for field, (have, want) in expected.items():
            if have != want:
                raise EdgecapError(
                    f"visual open_clip {vc.backbone!r}: config {field}={have}, but the backbone needs {want} "
                    f"(use edgecap.models.pretrained.openclip_overrides)"
                )

    def forward(self, images, mask=None):
        feats = grid_tokens(self.backbone, images)
        return feats, torch.ones(feats.shape[:2], dtype=torch.bool, device=feats.device)


def openclip_overrides(backbone: str, weights: str | os.PathLike, sha256: str = "") -> dict:
    """Config overrides for an `open_clip` front end: `build(name, **openclip_overrides(...))`."""
    visual, prep = load_open_clip_visual(backbone, weights, sha256)
    n_tokens, width = grid_shape(visual, prep.size)
    return {
        "d_in": width,
        "n_regions": n_tokens,
        "encoder_positions": "sinusoidal",
        "visual": {
            "kind": "open_clip",
            "backbone": backbone,
            "weights": str(weights),
            "weights_sha256": sha256,
            **prep.visual_overrides(),
        },
    }
