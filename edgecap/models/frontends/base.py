"""Frozen real-size visual front ends: a camera image in, a grid of feature tokens out.

    images [B, 3, H, W] (normalised as `preprocessing()` says) -> feats [B, N, D], mask [B, N]

N = (H / stride)^2 grid cells of width D. Each front end is a frozen backbone (no gradients,
always in eval mode, so BatchNorm statistics never move) whose weights come from a local file
the user names (`visual.weights`, checked against the architecture with a one-line error) or,
when none is named, from a **seeded** random initialisation (`RANDOM_SEED`): the same random
backbone in `edgecap features extract`, `edgecap train` and `edgecap export`, so tests and
benchmarks can run the whole pipeline without weights; the bundle manifest then says "random".

`FRONT_ENDS` is the table of the front ends edgecap ships and benchmarks; the open_clip front
end also takes any open_clip ViT / ModifiedResNet config (a built-in name or a JSON file).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edgecap.contract.manifest import RANDOM_WEIGHTS
from edgecap.errors import EdgecapError, did_you_mean
from edgecap.io import sha256_file
from edgecap.models.config import CaptionerConfig
from edgecap.models.frontends.openclip_names import open_clip_names
from edgecap.models.pretrained import resolve_weights, weights_file
from edgecap.models.registry import VISUAL

RANDOM_SEED = 0
RANDOM = RANDOM_WEIGHTS  # what the manifest and HDF5 provenance say for seeded random weights


@dataclass(frozen=True)
class FrontEndInfo:
    name: str  # visual.backbone
    kind: str  # visual.kind
    tokens: str  # what a grid cell's feature is
    stride: int  # pixels per grid cell
    width: int  # D
    size: int = 224  # the input size the weights were trained at


FRONT_ENDS: dict[str, FrontEndInfo] = {
    f.name: f
    for f in (
        FrontEndInfo("ViT-B-32", "open_clip", "patch tokens of the last block after ln_post", 32, 768),
        FrontEndInfo("ViT-B-16", "open_clip", "patch tokens of the last block after ln_post", 16, 768),
        FrontEndInfo("ViT-L-14", "open_clip", "patch tokens of the last block after ln_post", 14, 1024),
        FrontEndInfo("RN50", "open_clip", "layer4 feature map (before attention pooling)", 32, 2048),
        FrontEndInfo("resnet50", "torchvision", "layer4 feature map", 32, 2048),
        FrontEndInfo("mobilenet_v3_large", "torchvision", "last feature map (960-channel 1x1 conv)", 32, 960),
        FrontEndInfo("efficientnet_b0", "torchvision", "last feature map (1280-channel 1x1 conv)", 32, 1280),
        FrontEndInfo("efficientnet_lite0", "efficientnet_lite", "last feature map (1280-channel 1x1 conv, ReLU6)",
                     32, 1280),
    )
}
FRONT_END_KINDS = ("open_clip", "torchvision", "efficientnet_lite")

_SKELETON = contextvars.ContextVar("edgecap_frontend_skeleton", default=False)


@contextlib.contextmanager
def skeleton_front_ends():
    """Build front ends with uninitialised weights and without opening their weights file:
    for loading a checkpoint, whose state dict holds the backbone's weights anyway."""
    token = _SKELETON.set(True)
    try:
        yield
    finally:
        _SKELETON.reset(token)


def weights_to_load(vc, what: str):
    """The checked weights file a front end loads, or None (random init, or skeleton mode:
    the checkpoint's state dict brings the weights, the file need not exist here)."""
    if not vc.weights or _SKELETON.get():
        return None

    return resolve_weights(vc.weights, vc.weights_sha256, what=what)


def _only_persistent_state(module: nn.Module) -> bool:
    named = {n for n, _ in module.named_parameters()} | {n for n, _ in module.named_buffers()}
    return named <= set(module.state_dict())


CALIBRATION_IMAGES = 8


@torch.no_grad()
def calibrate_batchnorm(module: nn.Module, size: int) -> None:
    """Set every BatchNorm's running statistics from seeded noise images.

    A randomly initialised CNN in eval mode normalises with mean 0 / variance 1, which its
    activations are far from: the last feature map of a random mobilenet_v3_large is ~1e-8,
    of efficientnet_b0 ~1e-13, which makes random front ends useless for parity checks. One
    pass in train mode over standard-normal images (cumulative averages) gives every layer
    unit-scale activations, as real statistics would.
    """
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    g = torch.Generator().manual_seed(RANDOM_SEED)
    module.eval()
    for m in norms:  # only the norms learn: dropout / stochastic depth stay off and deterministic
        m.train()
    module(torch.randn(CALIBRATION_IMAGES, 3, size, size, generator=g))
    module.eval()
    for m in norms:
        m.momentum = 0.1


def materialise(build, load=None, size: int = 224) -> nn.Module:
    """`build()` a backbone and give it weights: `load(module)` when a file is named, the
    checkpoint's (skeleton mode) or the seeded random initialisation otherwise (with BatchNorm
    statistics from `calibrate_batchnorm` at `size` pixels).

    Loading builds on the meta device and allocates empty storage (a ViT-L's random
    initialisation alone takes ~10 s on a small CPU); a backbone with non-persistent buffers
    (whose values no state dict restores) is initialised normally first.
    """
    if load is not None or _SKELETON.get():
        with torch.device("meta"):
            module = build()
        if _only_persistent_state(module):
            module = module.to_empty(device="cpu")
            if load is not None:
                load(module)
            return module
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_SEED)
        module = build()
    if load is not None:
        load(module)
    else:
        calibrate_batchnorm(module, size)
    return module


def require_multiple(backbone: str, size: int, stride: int) -> int:
    if size < stride or size % stride:
        raise EdgecapError(
            f"visual {backbone!r}: image_size {size} is not a multiple of its stride {stride} "
            f"(choose e.g. {max(stride, size // stride * stride)} or {(size // stride + 1) * stride})"
        )
    return (size // stride) ** 2


class FrontEnd(nn.Module):
    """A frozen backbone returning grid tokens; subclasses say how to build, load and read it."""

    takes_images = True
    kind = ""

    # -- what a subclass supplies ---------------------------------------------------------
    @classmethod
    def default_size(cls, backbone: str) -> int:
        """The input size the backbone's weights were trained at."""
        raise NotImplementedError

    @classmethod
    def geometry(cls, backbone: str, size: int) -> tuple[int, int]:
        """(grid tokens N, width D) of `backbone` at `size` pixels; errors name the backbone."""
        raise NotImplementedError

    @classmethod
    def recipe(cls, backbone: str, size: int):
        """The `Preprocessing` the weights were trained with, at `size` pixels."""
        raise NotImplementedError

    @classmethod
    def describe(cls, backbone: str) -> str:
        """What a grid cell's feature is."""
        return FRONT_ENDS[backbone].tokens if backbone in FRONT_ENDS else ""

    def build_backbone(self, vc) -> nn.Module:
        raise NotImplementedError

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------
    def __init__(self, cfg):
        super().__init__()
        vc = cfg.visual
        n_tokens, width = self.geometry(vc.backbone, vc.image_size)
        recipe = self.recipe(vc.backbone, vc.image_size)
        expected = {
            "d_in": (cfg.d_in, width),
            "n_regions": (cfg.n_regions, n_tokens),
            "visual.mean": (_rounded(vc.mean), _rounded(recipe.mean)),
            "visual.std": (_rounded(vc.std), _rounded(recipe.std)),
        }
        for name, (have, want) in expected.items():
            if have != want:
                raise EdgecapError(
                    f"visual {vc.kind} {vc.backbone!r} at {vc.image_size} px: config {name}={have}, but the "
                    f"backbone needs {want} (edgecap.models.frontends.frontend_overrides gives every field)"
                )
        self.cfg = cfg
        self.backbone = self.build_backbone(vc)
        self.backbone.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True):
        return super().train(False)  # frozen: BatchNorm statistics and dropout never train

    def forward(self, images, mask=None):
        with torch.no_grad():
            feats = self.tokens(images)
        return feats, torch.ones(feats.shape[:2], dtype=torch.bool, device=feats.device)


class TableFrontEnd(FrontEnd):
    """A CNN front end whose backbones are rows of FRONT_ENDS (torchvision's, EfficientNet-Lite):
    size, grid and width from the table; the tokens are the last feature map's cells."""

    label = ""  # how errors name the family ("torchvision")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in FRONT_ENDS.values() if f.kind == cls.kind)

    @classmethod
    def check_name(cls, backbone: str) -> None:
        names = cls.names()
        if backbone not in names:
            raise EdgecapError(f"unknown {cls.label} backbone {backbone!r}{did_you_mean(backbone, names)}; "
                               f"valid: {', '.join(names)}")

    @classmethod
    def default_size(cls, backbone: str) -> int:
        cls.check_name(backbone)
        return FRONT_ENDS[backbone].size

    @classmethod
    def geometry(cls, backbone: str, size: int) -> tuple[int, int]:
        cls.check_name(backbone)
        info = FRONT_ENDS[backbone]
        return require_multiple(backbone, size, info.stride), info.width

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images).flatten(2).transpose(1, 2)  # [B, C, h, w] -> [B, h*w, C]


def _rounded(values) -> tuple:
    return tuple(round(float(v), 6) for v in values)


def frontend_class(kind: str) -> type[FrontEnd]:
    cls = VISUAL.get(kind)
    if not (isinstance(cls, type) and issubclass(cls, FrontEnd)):
        raise EdgecapError(
            f"visual kind {kind!r} is not a real-size front end; front ends: {', '.join(FRONT_END_KINDS)}"
        )
    return cls


def kind_of(backbone: str) -> str:
    """The visual kind of a backbone in FRONT_ENDS, or of an open_clip name / config file."""
    if backbone in FRONT_ENDS:
        return FRONT_ENDS[backbone].kind
    if backbone.endswith(".json"):
        return "open_clip"
    if backbone in open_clip_names():
        return "open_clip"
    raise EdgecapError(
        f"unknown front end {backbone!r}{did_you_mean(backbone, FRONT_ENDS)}; front ends: "
        f"{', '.join(FRONT_ENDS)} (or any open_clip model name / config .json)"
    )


def frontend_overrides(backbone: str, image_size: int = 0, weights: str = "", sha256: str = "",
                       kind: str = "") -> dict:
    """CaptionerConfig overrides for a front end: `build("smart", **frontend_overrides("RN50"))`.

    image_size 0 means the size the weights were trained at; the grid (n_regions), width
    (d_in), sinusoidal encoder positions and the weights' preprocessing follow from it.
    """
    kind = kind or kind_of(backbone)
    cls = frontend_class(kind)
    size = int(image_size or (FRONT_ENDS[backbone].size if backbone in FRONT_ENDS else cls.default_size(backbone)))
    n_tokens, width = cls.geometry(backbone, size)
    recipe = cls.recipe(backbone, size)
    return {
        "d_in": width,
        "n_regions": n_tokens,
        "encoder_positions": "sinusoidal",
        "visual": {"kind": kind, "backbone": backbone, "weights": str(weights or ""), "weights_sha256": sha256,
                   **recipe.visual_overrides()},
    }


def build_frontend(backbone: str, image_size: int = 0, weights: str = "", sha256: str = "") -> FrontEnd:
    """A front end on its own (no captioner): `edgecap features extract`, benchmarks."""
    cfg = CaptionerConfig(name=f"frontend-{backbone}").replace(
        **frontend_overrides(backbone, image_size, weights, sha256))
    return frontend_class(cfg.visual.kind)(cfg)


def provenance(vc, n_tokens: int, width: int) -> dict:
    """What made a set of features: written into HDF5 files, checked when a bundle gets the
    front end its captioner was trained on."""
    backbone = Path(vc.backbone).stem if vc.backbone.endswith(".json") else vc.backbone
    return {
        "kind": vc.kind,
        "backbone": backbone,
        "weights_sha256": (vc.weights_sha256 or sha256_file(weights_file(vc.weights))) if vc.weights else RANDOM,
        "preprocessing": vc.preprocessing(),
        "tokens": frontend_class(vc.kind).describe(vc.backbone),
        "n_regions": n_tokens,
        "dim": width,
    }


def weights_label(vc) -> str:
    """What the manifest says about a front end's weights: a file name, or "random"."""
    return weights_file(vc.weights).name if vc.weights else RANDOM
