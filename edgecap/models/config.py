"""Model configuration: plain dataclasses, stored verbatim in checkpoints.

`CaptionerConfig` holds what every family shares and the visual front end's settings. A
variant's own hyper-parameters are a dataclass its module registers (`CONFIG_SECTIONS`,
e.g. `memory` in attention/memory.py); the config holds one of each registered section, read
and written as a nested table of the same name (`"memory": {"slots": 40}`) and reached as an
attribute (`cfg.memory.slots`), so a new variant adds a section without touching this file.
`CaptionerConfig.from_dict` rebuilds a config from a checkpoint or a preset file and rejects
unknown keys by name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

from edgecap.contract.preprocess import Preprocessing
from edgecap.errors import EdgecapError, did_you_mean
from edgecap.models.registry import CONFIG_SECTIONS, DECODERS
from edgecap.typed import typed


@dataclass
class VisualConfig:
    """Where the feature sequence [B, N, D_in] comes from.

    kind: "features" (precomputed regions / grid, e.g. HDF5), "cnn" (small CNN trained from
    scratch on images), "open_clip" (grid of an open_clip ViT or ModifiedResNet) or
    "torchvision" (last feature map of a torchvision CNN); the last two are frozen real-size
    front ends (models/frontends.py), with weights from a local file or seeded random ones.
    """

    kind: str = "features"
    image_size: int = 224
    channels: tuple[int, ...] = (32, 64, 128, 128)
    backbone: str = ""  # open_clip / torchvision model name, e.g. "ViT-B-32", "resnet50"
    weights: str = ""  # local file, never downloaded; "" = seeded random init (front ends)
    weights_sha256: str = ""
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    resize: str = "bilinear"  # OpenCV filter name used by training and the runtime
    channel_order: str = "RGB"
    crop: str = "none"  # "none": squash the frame to image_size; "center": resize + centre crop
    resize_size: int = 0  # crop "center": shorter side before cropping (0 = image_size)

    def preprocessing(self) -> dict:
        """The manifest's `preprocessing` record (contract.preprocess.Preprocessing as a dict)."""
        return Preprocessing(self.image_size, tuple(self.mean), tuple(self.std), self.resize, self.channel_order,
                             self.crop, self.resize_size).to_dict()


@dataclass
class CaptionerConfig:
    """Everything needed to rebuild a captioner; `cfg.to_dict()` goes into checkpoints."""

    name: str = "custom"
    family: str = "transformer"
    decoder: str = "transformer"  # "transformer" or "lstm"
    vocab_size: int = 10000
    max_len: int = 20  # T: static cache length and longest caption, in tokens incl. EOS
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    dropout: float = 0.1
    enc_layers: int = 3
    dec_layers: int = 3
    encoder_attention: str = "plain"
    decoder_self_attention: str = "plain"
    cross_attention: str = "single"
    encoder_positions: str = "none"  # "none" for region sets, "sinusoidal" for grids
    d_in: int = 2048
    n_regions: int = 50  # static N of the feature sequence
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3
    visual: VisualConfig = field(default_factory=VisualConfig)
    # section name -> that variant's dataclass, one per registered section (defaults where unset)
    sections: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.sections = {name: self.sections.get(name) or CONFIG_SECTIONS.get(name)() for name in CONFIG_SECTIONS.names()}
        for name in ("d_model", "n_heads", "d_ff", "d_in", "n_regions"):
            if getattr(self, name) < 1:
                raise EdgecapError(f"config {self.name!r}: {name}={getattr(self, name)}, expected >= 1")
        if not 0 <= self.dropout < 1:
            raise EdgecapError(f"config {self.name!r}: dropout={self.dropout}, expected a probability in [0, 1)")
        if self.d_model % self.n_heads and DECODERS.get(self.decoder).splits_heads:
            raise EdgecapError(
                f"config {self.name!r}: d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        if self.max_len < 2:
            raise EdgecapError(f"config {self.name!r}: max_len={self.max_len}, expected >= 2")

    def __getattr__(self, name: str):
        """A variant's section by its name: `cfg.memory.slots`."""
        sections = self.__dict__.get("sections") or {}
        if name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        """The shared fields, then each section as a table of its own, then `visual`: the layout
        checkpoints and bundle manifests have always held."""
        data = asdict(self)
        sections, visual = data.pop("sections"), data.pop("visual")
        return {**data, **dict(sorted(sections.items())), "visual": visual}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> CaptionerConfig:
        if not isinstance(data, dict):
            raise EdgecapError(f"{where}: expected a table of fields, got {type(data).__name__}")
        names = CONFIG_SECTIONS.names()
        own = {k: v for k, v in data.items() if k not in names}
        sections = {k: _from_dict(CONFIG_SECTIONS.get(k), v, f"{where}.{k}") for k, v in data.items() if k in names}
        return _from_dict(cls, own, where, extra_fields=names, sections=sections)

    def replace(self, **overrides) -> CaptionerConfig:
        """A copy with overrides; nested fields as dicts or dotted names ("memory.slots")."""
        data = self.to_dict()
        for key, value in overrides.items():
            _set_dotted(data, key, value, self.name)
        return CaptionerConfig.from_dict(data, where=f"config {self.name!r}")


def _set_dotted(data: dict, key: str, value, name: str) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            raise EdgecapError(f"config {name!r}: unknown field {key!r}")
        node = node[part]
    if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
        node[parts[-1]] = {**node[parts[-1]], **value}
    else:
        node[parts[-1]] = value


def _from_dict(cls, data: dict[str, Any], where: str, extra_fields=(), **given):
    """`cls` from a table; `extra_fields` are further valid keys, read by the caller into `given`."""
    if not isinstance(data, dict):
        raise EdgecapError(f"{where}: expected a table of fields, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in given}
    unknown = [k for k in data if k not in fields]
    if unknown:
        k, valid = unknown[0], [*fields, *extra_fields]
        raise EdgecapError(
            f"{where}: unknown field {k!r}{did_you_mean(k, valid)}; valid fields: {', '.join(valid)}"
        )
    kwargs = {}
    for key, value in data.items():
        default = fields[key].default_factory if fields[key].default_factory is not dataclasses.MISSING else None
        sub = default() if default is not None else None
        if dataclasses.is_dataclass(sub):
            kwargs[key] = _from_dict(type(sub), value, f"{where}.{key}")
        else:
            # `"160"` for d_model or `"16"` for memory.slots would only fail deep inside torch
            own = fields[key].default if default is None else default()
            kwargs[key] = typed(value, own, f"{where}.{key}", any_length="..." in str(fields[key].type))
    return cls(**kwargs, **given)
