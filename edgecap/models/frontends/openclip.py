"""open_clip visual towers as front ends: ViTs (patch-token grids) and ModifiedResNets (RN50).

- ViT: tokens of the last transformer block **after** `ln_post` (the norm CLIP trained in
  front of its projection; the raw residual stream of large ViTs has a few huge-magnitude
  channels), **before** the projection, so D is the ViT width (768 for ViT-B, 1024 for ViT-L);
  the CLS token excluded, so N = (size / patch)^2 is a square grid.
- ModifiedResNet (RN50): the layer4 feature map [2048, size/32, size/32] before attention
  pooling; the pooling head is dropped after loading.

Only the visual tower is built (no text tower), from open_clip's own config and builder. A
weights file may hold a whole CLIP state dict (`visual.*` keys; the text tower is ignored) or
the visual tower alone; a ViT loaded at another image size gets its position embeddings
resized by open_clip's own `resize_pos_embed`, as `create_model(force_image_size=...)` does.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from edgecap.contract.preprocess import Preprocessing
from edgecap.errors import EdgecapError, did_you_mean
from edgecap.models.frontends.base import FrontEnd, materialise, require_multiple, weights_to_load
from edgecap.models.frontends.openclip_names import open_clip_module, open_clip_names
from edgecap.models.pretrained import check_fits, is_torchscript, read_state_dict
from edgecap.models.registry import VISUAL

# open_clip's interpolation names -> the OpenCV filter names `contract.preprocess` accepts.
_RESIZE_NAMES = {"bicubic": "bicubic", "bilinear": "bilinear", "nearest": "nearest", "area": "area"}
# open_clip's resize_mode -> edgecap's crop
_CROPS = {"shortest": "center", "squash": "none"}


def model_name(backbone: str) -> str:
    """A built-in open_clip config name, or the name of a registered custom config JSON."""
    open_clip = open_clip_module()
    if not backbone:
        raise EdgecapError("open_clip: no backbone named (e.g. ViT-B-32, or a model config .json file)")
    if backbone.endswith(".json"):
        path = Path(backbone).expanduser()
        if not path.is_file():
            raise EdgecapError(f"open_clip model config {path} does not exist")
        open_clip.add_model_config(path)
        open_clip_names.cache_clear()
        return path.stem
    if backbone not in open_clip_names():
        raise EdgecapError(
            f"unknown open_clip backbone {backbone!r}{did_you_mean(backbone, open_clip_names())} "
            f"(built-in names from open_clip.list_models(), or a model config .json file)"
        )
    return backbone


def model_config(backbone: str) -> dict:
    cfg = open_clip_module().get_model_config(model_name(backbone))
    if not cfg or "vision_cfg" not in cfg:
        raise EdgecapError(f"open_clip backbone {backbone!r} has no vision_cfg")
    vision = cfg["vision_cfg"]
    if vision.get("timm_model_name") or vision.get("hf_model_name"):
        raise EdgecapError(f"open_clip backbone {backbone!r} wraps a timm / Hugging Face tower; "
                           f"edgecap reads open_clip's own ViTs and ModifiedResNets")
    return cfg


def _is_resnet(vision: dict) -> bool:
    return isinstance(vision.get("layers"), (list, tuple))


@contextlib.contextmanager
def _quietopen_clip_module():
    """open_clip logs through the root logger (e.g. that a model is randomly initialised)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def build_tower(backbone: str, size: int) -> nn.Module:
    open_clip = open_clip_module()
    cfg = model_config(backbone)
    vision = {**cfg["vision_cfg"], "image_size": size}
    builder = getattr(getattr(open_clip, "model", None), "_build_vision_tower", None)
    with _quietopen_clip_module():
        if builder is not None:
            return builder(cfg["embed_dim"], vision, quick_gelu=cfg.get("quick_gelu", False))
        # open_clip without the tower builder: the whole model, text tower dropped
        model = open_clip.create_model(model_name(backbone), pretrained=None, pretrained_image=False,
                                       pretrained_text=False, force_image_size=size)
        return model.visual


def _visual_part(state: dict) -> dict:
    if any(k.startswith("visual.") for k in state):
        return {k[len("visual."):]: v for k, v in state.items() if k.startswith("visual.")}
    return state


def _check_openai_activation(tower: nn.Module, path: Path, backbone: str) -> None:
    """OpenAI trained its CLIP ViTs with QuickGELU; in a GELU tower their features would be
    quietly off (open_clip only warns). A TorchScript archive is OpenAI's own release."""
    if is_torchscript(path) and any(isinstance(m, nn.GELU) for m in tower.modules()):
        name = f"{model_name(backbone)}-quickgelu"
        hint = f"use --backbone {name}" if name in open_clip_names() else "use a -quickgelu model config"
        raise EdgecapError(f"open_clip weights {path} are OpenAI's CLIP release, trained with QuickGELU, "
                           f"but backbone {backbone!r} uses GELU: {hint}")


def load_tower(tower: nn.Module, path: Path, backbone: str) -> None:
    _check_openai_activation(tower, path, backbone)
    state = _visual_part(read_state_dict(path, "open_clip weights"))
    own = tower.state_dict()
    pos = state.get("positional_embedding")
    if pos is not None and "positional_embedding" in own and pos.shape != own["positional_embedding"].shape:
        wrapped = {"visual.positional_embedding": pos}
        open_clip_module().model.resize_pos_embed(wrapped, SimpleNamespace(visual=tower))
        state = {**state, "positional_embedding": wrapped["visual.positional_embedding"]}
    check_fits(own, state, path, backbone, "open_clip weights")
    tower.load_state_dict(state, strict=True)


@VISUAL.register("open_clip")
class OpenCLIPFrontEnd(FrontEnd):
    kind = "open_clip"

    @classmethod
    def default_size(cls, backbone: str) -> int:
        return int(model_config(backbone)["vision_cfg"].get("image_size", 224))

    @classmethod
    def geometry(cls, backbone: str, size: int) -> tuple[int, int]:
        vision = model_config(backbone)["vision_cfg"]
        if _is_resnet(vision):
            return require_multiple(backbone, size, 32), int(vision.get("width", 64)) * 32
        patch = vision.get("patch_size", 16)
        return require_multiple(backbone, size, int(patch)), int(vision["width"])

    @classmethod
    def recipe(cls, backbone: str, size: int) -> Preprocessing:
        open_clip = open_clip_module()
        defaults = open_clip.transform.PreprocessCfg()
        given = dict(model_config(backbone).get("preprocess_cfg") or {})
        mode = given.get("resize_mode", defaults.resize_mode)
        if mode not in _CROPS:
            raise EdgecapError(f"open_clip backbone {backbone!r} uses resize_mode {mode!r}; edgecap handles "
                               f"{', '.join(_CROPS)}")
        return Preprocessing(
            size=int(size),
            mean=tuple(float(m) for m in given.get("mean", defaults.mean)),
            std=tuple(float(s) for s in given.get("std", defaults.std)),
            resize=_RESIZE_NAMES.get(str(given.get("interpolation", defaults.interpolation)), "bicubic"),
            channel_order="RGB",
            crop=_CROPS[mode],
            resize_size=int(size),  # open_clip resizes the shorter side to the crop size
        )

    @classmethod
    def describe(cls, backbone: str) -> str:
        if _is_resnet(model_config(backbone)["vision_cfg"]):
            return "layer4 feature map (before attention pooling)"
        return "patch tokens of the last block after ln_post, CLS excluded"

    def build_backbone(self, vc) -> nn.Module:
        load = None
        path = weights_to_load(vc, "open_clip weights")
        if path is not None:
            load = lambda tower: load_tower(tower, path, vc.backbone)  # noqa: E731
        tower = materialise(lambda: build_tower(vc.backbone, vc.image_size), load, vc.image_size)
        self.is_resnet = hasattr(tower, "attnpool")
        if self.is_resnet:
            tower.attnpool = nn.Identity()  # pooled embedding: not part of the grid
        elif not hasattr(tower, "forward_intermediates"):
            raise EdgecapError(f"open_clip backbone {vc.backbone!r}: this open_clip has no forward_intermediates")
        return tower

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        if self.is_resnet:
            fmap = self.backbone.forward_intermediates(images, indices=1, intermediates_only=True)
            return fmap["image_intermediates"][-1].flatten(2).transpose(1, 2)
        return grid_tokens(self.backbone, images)


def grid_tokens(tower: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """images [B, 3, H, W] (normalised) -> ViT patch tokens of the last block after ln_post [B, N, D]."""
    out = tower.forward_intermediates(
        images, indices=1, normalize_intermediates=True, intermediates_only=True, output_fmt="NLC"
    )
    return out["image_intermediates"][-1]
