"""Build a captioner from a preset name or a config: look up, build, (optionally) load."""

from __future__ import annotations

from edgecap.models.captioner import CaptionModel
from edgecap.models.config import CaptionerConfig
from edgecap.models.registry import (
    CROSS_ATTENTION,
    DECODER_SELF_ATTENTION,
    DECODERS,
    ENCODER_ATTENTION,
    VISUAL,
    load_preset,
)


def preset_config(name: str, **overrides) -> CaptionerConfig:
    """The preset's config with overrides (nested ones as dicts or "memory.slots"=...)."""
    cfg = CaptionerConfig.from_dict(load_preset(name), where=f"preset {name!r}")
    return cfg.replace(**overrides) if overrides else cfg


def check_parts(cfg: CaptionerConfig) -> None:
    """Every part the config names is registered (a one-line "did you mean" otherwise), so a
    typo such as visual.kind = "cnnn" fails before a training run prepares its data."""
    for registry, name in ((DECODERS, cfg.decoder), (ENCODER_ATTENTION, cfg.encoder_attention),
                           (DECODER_SELF_ATTENTION, cfg.decoder_self_attention),
                           (CROSS_ATTENTION, cfg.cross_attention), (VISUAL, cfg.visual.kind)):
        registry.get(name)


def takes_images(kind: str) -> bool:
    """Whether the visual front end `kind` reads images (else precomputed features)."""
    return bool(VISUAL.get(kind).takes_images)


def build_from_config(cfg: CaptionerConfig) -> CaptionModel:
    return DECODERS.get(cfg.decoder)(cfg)


def build(name: str, **overrides) -> CaptionModel:
    """`build("smart", vocab_size=500, d_model=128)` -> a freshly initialised model."""
    return build_from_config(preset_config(name, **overrides))
