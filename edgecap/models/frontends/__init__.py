"""Frozen real-size visual front ends (open_clip ViTs / RN50, torchvision CNNs); see base.py."""

from edgecap.models.frontends.base import (
    FRONT_END_KINDS,
    FRONT_ENDS,
    RANDOM,
    RANDOM_SEED,
    FrontEnd,
    FrontEndInfo,
    build_frontend,
    frontend_class,
    frontend_overrides,
    kind_of,
    provenance,
    skeleton_front_ends,
    weights_label,
)

__all__ = ["FRONT_END_KINDS", "FRONT_ENDS", "RANDOM", "RANDOM_SEED", "FrontEnd", "FrontEndInfo", "build_frontend", "frontend_class",
           "frontend_overrides", "kind_of", "provenance", "skeleton_front_ends", "weights_label"]
