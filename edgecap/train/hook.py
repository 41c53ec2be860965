"""Training hooks: what a variant needs from the training loop beyond the core's XE and SCST
steps, in one object the variant names.

A variant class (an attention module, a decoder, a front end) sets `training_hook = "<name>"`;
the hook is a `TrainingHook` subclass registered under that name in a module of
`edgecap.train.hooks` (found there, like attention variants: no list names it). It brings

    its config section   `Config`, a dataclass read from the training config's [<name>] table
                         (and `--set <name>.key=value`); `check` refuses bad settings in one line
    setup                `setup(run)` once the model is built, before the data loaders
    extra inputs         `inputs` it feeds the encoder (RA-T's retrieved captions): per
                         training image (`for_item`) and for other images (`for_features`)
    every step           `before_forward(token_mask)`, `after_step(step)` -> a metrics line
    the checkpoint       `state_dict()` into last.state.pt under `state_key`, `load_state_dict`
                         on --resume; `close()` when the run ends

The trainer calls hooks and never tests a variant's name (tests/test_variant_names.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from edgecap.errors import EdgecapError
from edgecap.models.registry import Registry, part_classes

HOOKS = Registry("training hook", ("edgecap.train.hooks",))


@dataclass(frozen=True)
class HookRun:
    """What a hook may use of the run it joins."""

    model: Any  # the CaptionModel, built and on its device (weights of --init-from loaded)
    cfg: Any  # the TrainConfig, its paths resolved
    out: Path  # the run directory
    vocab: Any
    splits: Any  # KarpathySplits
    images: Path | None  # the image root, when the front end reads images
    features: Path | None  # the HDF5 file, when it reads precomputed features
    is_main: bool  # rank 0 (the one that writes files)
    progress: bool


class TrainingHook:
    name: ClassVar[str] = ""  # set by `register`
    Config: ClassVar[type | None] = None  # the dataclass of its [name] section (None: no section)
    # why a preset without this hook may not set its section ("has no prototype memory")
    unused: ClassVar[str] = "does not use it"
    state_key: ClassVar[str] = ""  # its entry in last.state.pt ("": no state to resume)
    inputs: ClassVar[tuple[str, ...]] = ()  # the encoder's extra inputs it feeds, in order
    freezes_visual: ClassVar[bool] = False  # the front end must stay as it is (no gradients, eval mode)

    def __init__(self, config=None):
        self.config = config if config is not None or self.Config is None else self.Config()

    @classmethod
    def check(cls, config, model_cfg, where: str) -> None:
        """Refuse settings of its section that cannot work with `model_cfg` (one line, naming
        `where`), when the training config is read."""

    @classmethod
    def for_checkpoint(cls, checkpoint) -> TrainingHook:
        """The hook of a trained checkpoint, ready to feed its extra inputs (`edgecap caption`)."""
        raise EdgecapError(f"{cls.name}: this training hook cannot caption with a checkpoint")

    def setup(self, run: HookRun) -> None:
        pass

    def for_item(self, item, rng) -> tuple:
        """Extra inputs of one training image (the dataset's `extra`); rng: the image's stream."""
        return ()

    def for_features(self, feats, mask) -> tuple:
        """Extra inputs of a batch of images outside the training set (validation, captioning)."""
        return ()

    def before_forward(self, token_mask) -> None:
        """token_mask [B, L] bool: the decoder input positions of the next training forward
        that predict a real token."""

    def after_step(self, step: int) -> dict | None:
        """After optimizer step `step`: a metrics line (kind = the hook's name), or None."""
        return None

    def state_dict(self):
        return None

    def load_state_dict(self, state) -> None:
        pass

    def close(self) -> None:
        pass


def register(name: str):
    """Class decorator: `@register("prototypes")` registers a hook under the name its variant
    gives (`training_hook = "prototypes"`), which is also its config section."""

    def wrap(cls):
        cls.name = name
        if cls.Config is not None and not dataclasses.is_dataclass(cls.Config):
            raise TypeError(f"training hook {name!r}: Config must be a dataclass")
        return HOOKS.register(name)(cls)

    return wrap


def hook_classes(model_cfg) -> list[type[TrainingHook]]:
    """The hooks the parts of `model_cfg` name, each once, in the order of the parts."""
    names = dict.fromkeys(getattr(part, "training_hook", "") for part in part_classes(model_cfg))
    return [HOOKS.get(name) for name in names if name]


def sections() -> dict[str, type]:
    """Every registered hook's config section: name -> its dataclass."""
    return {name: HOOKS.get(name).Config for name in HOOKS.names() if HOOKS.get(name).Config is not None}


class Hooks(list):
    """The hooks of one run (or one checkpoint), called as one."""

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(name for hook in self for name in hook.inputs)

    @property
    def freezes_visual(self) -> bool:
        return any(hook.freezes_visual for hook in self)

    def for_item(self, item, rng) -> tuple:
        return tuple(x for hook in self for x in hook.for_item(item, rng))

    def for_features(self, feats, mask) -> tuple:
        return tuple(x for hook in self for x in hook.for_features(feats, mask))

    def before_forward(self, token_mask) -> None:
        for hook in self:
            hook.before_forward(token_mask)

    def close(self) -> None:
        for hook in self:
            hook.close()


def run_hooks(model_cfg, cfg, model) -> Hooks:
    """The hooks of a training run, each with its section of `cfg`; fails in one line when the
    model takes extra encoder inputs that its hooks do not feed."""
    hooks = Hooks(cls(cfg.hook_sections.get(cls.name)) for cls in hook_classes(model_cfg))
    wanted = tuple(getattr(model, "encode_extra_names", ()))
    if hooks.inputs != wanted:
        fed = f"its training hooks feed {list(hooks.inputs)}" if hooks.inputs else "no training hook feeds them"
        raise EdgecapError(f"preset {cfg.preset!r} needs extra encoder inputs {list(wanted)}; {fed}")
    return hooks


def checkpoint_hooks(checkpoint) -> Hooks | None:
    """What feeds a trained checkpoint's extra encoder inputs when it captions (RA-T: the
    retrieval index its config names); None when it takes none."""
    hooks = Hooks(cls.for_checkpoint(checkpoint) for cls in hook_classes(checkpoint.config) if cls.inputs)
    return hooks or None
