"""Give a captioner trained on cached features the front end that computed them.

A model trained on `edgecap features extract` output reads features (visual.kind "features"),
so its checkpoint has no backbone; `edgecap export --frontend NAME [--visual-weights FILE]`
builds that backbone into the bundle's visual graph. The features file's provenance, which
training copied into the checkpoint's meta, must agree with the front end being attached
(backbone, weights sha256, preprocessing): a bundle whose front end differs from the one
its captioner learned from would caption confidently and wrongly.
"""

from __future__ import annotations

from dataclasses import asdict

from edgecap.errors import EdgecapError


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-6 * max(1, abs(a))
    return a == b


def attach_frontend(ckpt, backbone: str, weights: str = "", image_size: int = 0) -> list[str]:
    """Replace `ckpt.model` by the same captioner reading images through `backbone`.

    -> notes for the user (e.g. that the checkpoint records no provenance to check against).
    """
    from edgecap.models.factory import build_from_config, takes_images
    from edgecap.models.frontends import build_frontend, provenance, skeleton_front_ends

    cfg, made = ckpt.config, dict(ckpt.meta.get("features_provenance") or {})
    if takes_images(cfg.visual.kind):
        raise EdgecapError(f"--frontend {backbone}: this checkpoint already reads images through its own "
                           f"front end ({cfg.visual.kind} {cfg.visual.backbone or ''}); --frontend is for "
                           f"captioners trained on precomputed features")
    size = image_size or int((made.get("preprocessing") or {}).get("size", 0) or 0)
    frontend = build_frontend(backbone, size, weights)
    fc = frontend.cfg
    for field, have, want in (("d_in", cfg.d_in, fc.d_in), ("n_regions", cfg.n_regions, fc.n_regions)):
        if have != want:
            raise EdgecapError(f"--frontend {backbone} at {fc.visual.image_size} px gives {field}={want}, "
                               f"but the checkpoint's captioner was trained with {field}={have}")
    notes = []
    if made:
        mine = provenance(fc.visual, fc.n_regions, fc.d_in)
        for key in ("backbone", "weights_sha256", "preprocessing"):
            if key in made and not _same(made[key], mine[key]):
                raise EdgecapError(f"--frontend {backbone}: the features this captioner was trained on were made "
                                   f"with {key}={made[key]!r}, this front end has {mine[key]!r}")
    else:
        notes.append(f"the checkpoint records no features provenance: nothing confirms that {backbone} "
                     f"made the features it was trained on")
    with skeleton_front_ends():  # its weights are `frontend`'s, copied in below
        model = build_from_config(cfg.replace(visual=asdict(fc.visual)))
    missing, unexpected = model.load_state_dict(ckpt.model.state_dict(), strict=False)
    if unexpected or any(not k.startswith("visual.") for k in missing):
        raise EdgecapError(f"--frontend {backbone}: the captioner's weights do not fit the rebuilt model "
                           f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.visual.load_state_dict(frontend.state_dict())
    ckpt.model = model.eval()
    return notes
