"""torchvision CNNs as front ends: the last feature map's cells are the tokens.

    resnet50             conv1 .. layer4                  [2048, size/32, size/32]  (the M2 / SMArT-style grid)
    mobilenet_v3_large   features (ends in a 1x1 conv)    [ 960, size/32, size/32]  (edge-sized)
    efficientnet_b0      features (ends in a 1x1 conv)    [1280, size/32, size/32]  (edge-sized)

Weights: a torchvision state dict of the whole classifier (what `torch.save(model.state_dict())`
and torchvision's own weight files hold), loaded strictly into the full model before its
classifier head is dropped; a file for another architecture is a one-line error naming the
first tensor that does not fit. The preprocessing is that of torchvision's DEFAULT weights for
the architecture (e.g. resnet50: bilinear, shorter side 232, centre crop 224, ImageNet
mean/std), scaled to the chosen input size.
"""

from __future__ import annotations

import torch
from torch import nn

from edgecap.contract.preprocess import Preprocessing
from edgecap.errors import EdgecapError, did_you_mean, require
from edgecap.models.frontends.base import (
    FRONT_ENDS,
    FrontEnd,
    materialise,
    require_multiple,
    weights_to_load,
)
from edgecap.models.pretrained import check_fits, read_state_dict
from edgecap.models.registry import VISUAL

NAMES = tuple(f.name for f in FRONT_ENDS.values() if f.kind == "torchvision")


def _torchvision():
    return require("torchvision", "train", "torchvision visual front ends")


def _check_name(backbone: str) -> None:
    if backbone not in NAMES:
        raise EdgecapError(f"unknown torchvision backbone {backbone!r}{did_you_mean(backbone, NAMES)}; "
                           f"valid: {', '.join(NAMES)}")


def _trunk(name: str, model: nn.Module) -> nn.Module:
    if name == "resnet50":
        m = model
        return nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool, m.layer1, m.layer2, m.layer3, m.layer4)
    return model.features


@VISUAL.register("torchvision")
class TorchvisionFrontEnd(FrontEnd):
    kind = "torchvision"

    @classmethod
    def default_size(cls, backbone: str) -> int:
        _check_name(backbone)
        return FRONT_ENDS[backbone].size

    @classmethod
    def geometry(cls, backbone: str, size: int) -> tuple[int, int]:
        _check_name(backbone)
        info = FRONT_ENDS[backbone]
        return require_multiple(backbone, size, info.stride), info.width

    @classmethod
    def recipe(cls, backbone: str, size: int) -> Preprocessing:
        _check_name(backbone)
        tv = _torchvision()
        t = tv.models.get_model_weights(backbone).DEFAULT.transforms()
        crop, short = int(t.crop_size[0]), int(t.resize_size[0])
        return Preprocessing(
            size=int(size),
            mean=tuple(float(m) for m in t.mean),
            std=tuple(float(s) for s in t.std),
            resize=str(t.interpolation.value),  # "bilinear" / "bicubic": OpenCV's names too
            channel_order="RGB",
            crop="center",
            resize_size=int(round(size * short / crop)),
        )

    def build_backbone(self, vc) -> nn.Module:
        tv = _torchvision()
        build = lambda: getattr(tv.models, vc.backbone)(weights=None)  # noqa: E731
        load = None
        path = weights_to_load(vc, "torchvision weights")
        if path is not None:

            def load(model):
                state = read_state_dict(path, "torchvision weights")
                check_fits(model.state_dict(), state, path, vc.backbone, "torchvision weights")
                model.load_state_dict(state, strict=True)

        return _trunk(vc.backbone, materialise(build, load, vc.image_size))

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images).flatten(2).transpose(1, 2)  # [B, C, h, w] -> [B, h*w, C]
