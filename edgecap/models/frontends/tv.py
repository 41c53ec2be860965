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

from torch import nn

from edgecap.contract.preprocess import Preprocessing
from edgecap.errors import require
from edgecap.models.frontends.base import TableFrontEnd, materialise, weights_to_load
from edgecap.models.pretrained import load_strict
from edgecap.models.registry import VISUAL


def _torchvision():
    return require("torchvision", "train", "torchvision visual front ends")


def _trunk(name: str, model: nn.Module) -> nn.Module:
    if name == "resnet50":
        m = model
        return nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool, m.layer1, m.layer2, m.layer3, m.layer4)
    return model.features


@VISUAL.register("torchvision")
class TorchvisionFrontEnd(TableFrontEnd):
    kind = "torchvision"
    label = "torchvision"

    @classmethod
    def recipe(cls, backbone: str, size: int) -> Preprocessing:
        cls.check_name(backbone)
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
        path = weights_to_load(vc, "torchvision weights")
        load = None if path is None else (lambda model: load_strict(model, path, vc.backbone, "torchvision weights"))
        return _trunk(vc.backbone, materialise(build, load, vc.image_size))
