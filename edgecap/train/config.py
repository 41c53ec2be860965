"""Training configuration: a TOML file read into dataclasses, one per section.

    [model]       preset = "smart", then any CaptionerConfig field as an override
                  (d_model = 128, memory = { slots = 16 }, visual = { kind = "cnn", ... })
    [data]        karpathy / images / features paths, or [data.synth] to generate the
                  synthetic world into the run directory; batch size, vocabulary min count
    [optim]       XE optimizer (adam | adamw), lr, betas, weight decay, gradient clipping
    [schedule]    XE learning-rate schedule (noam | warmup-constant-decay | constant), epochs
    [scst]        epochs of self-critical training after XE (0 = none), beams, baseline, lr
    [run]         seed, output directory, logging and checkpoint cadence

and one section per training hook (edgecap.train.hook), which its hook defines and checks:
[prototypes] for PMA-Net's prototype memory, [retrieval] for RA-Transformer's index. Setting
the section of a hook the preset does not use is an error.

Unknown sections or keys and wrongly typed values are one-line errors naming the key (with a
"did you mean"); nothing is silently fixed. Relative paths are relative to the directory the
run started in (edgecap.config_paths).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgecap.config_paths import existing_from_run_start, from_run_start
from edgecap.data.karpathy import KARPATHY_SOURCE
from edgecap.errors import EdgecapError, did_you_mean
from edgecap.typed import typed

SCHEDULES = ("noam", "warmup-constant-decay", "constant")
OPTIMIZERS = ("adam", "adamw")
BASELINES = ("mean", "greedy")
# Where a reader who has never had them gets the files [data] names (docs/training.md#getting-coco).
DATA_SOURCES = {
    "[data].karpathy": f"it is a Karpathy split file: {KARPATHY_SOURCE}",
    "[data].features": "region features in M2's layout: coco_detections.hdf5 as the "
                       "meshed-memory-transformer README links it, or `edgecap features extract` "
                       "from the images (docs/training.md#getting-coco)",
    "[data].images": "COCO's train2014/ and val2014/ image folders from cocodataset.org "
                     "(docs/training.md#getting-coco), or a synthetic world's images/",
}


@dataclass
class SynthSection:
    """Generate the synthetic tabletop world with these settings when it is not there yet."""

    images: int = 3000
    seed: int = 0
    size: int = 64
    image_format: str = "jpg"
    dir: str = ""  # default: <run dir>/data


@dataclass
class DataSection:
    karpathy: str = ""  # dataset_coco.json
    images: str = ""  # image root (joined with filepath/filename)
    features: str = ""  # HDF5 with <image_id>_features (instead of images)
    synth: SynthSection | None = None
    min_count: int = 5  # rarer words become <unk>
    batch_size: int = 10  # images per step per process (each with all its captions)
    val_batch_size: int = 50
    val_images: int = 0  # validate on the first N val images (0 = all)
    num_workers: int = 0
    augment: str = "none"  # "none" | "shift"
    shift_pixels: int = 4
    cache_images: bool = False  # keep decoded images in memory (small datasets; per process, so with num_workers = 0)


@dataclass
class OptimSection:
    optimizer: str = "adam"
    lr: float = 1.0  # noam: a multiplier of d^-0.5 * min(...); otherwise the peak lr
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8  # torch's default, what the M2 code's Adam uses (Vaswani et al. wrote 1e-9)
    weight_decay: float = 0.0
    grad_clip: float = 0.0  # max gradient norm, 0 = off


@dataclass
class ScheduleSection:
    kind: str = "noam"
    epochs: int = 20  # XE epochs (with patience: the most)
    patience: int = 0  # > 0: XE ends once validation CIDEr-D has not improved for this many epochs (M2: 5)
    warmup: int = 10000  # steps
    decay_start: int = 0  # warmup-constant-decay: step where decay begins (0 = never)
    decay_every: int = 1000  # steps between decays
    decay_rate: float = 0.8  # multiplier per decay
    min_lr: float = 0.0


@dataclass
class SCSTSection:
    epochs: int = 0  # with patience: the most
    patience: int = 0  # > 0: SCST ends once validation CIDEr-D has not improved for this many epochs (M2: 5)
    lr: float = 5e-6
    beam_size: int = 5  # k sequences per image
    baseline: str = "mean"  # "mean" of the k rewards (M2 / SMArT) or "greedy" (Rennie et al.)
    batch_size: int = 0  # images per step, 0 = data.batch_size
    optimizer: str = "adam"
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 0.0


@dataclass
class RunSection:
    seed: int = 0
    out: str = ""  # default: runs/<config file stem>
    log_every: int = 10  # steps per metrics.jsonl training line
    save_every: int = 0  # steps between last.pt saves inside an epoch (0 = epoch ends only)
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads, 0 = torch's default
    val_samples: int = 5  # validation captions echoed into metrics.jsonl
    average_last: int = 0  # > 0: averaged.pt = mean weights of the final phase's last N epoch ends
    init_from: str = ""  # an edgecap checkpoint whose weights (and vocabulary) a new run starts from
    val_beam: int = 1  # beam of the validation that selects best.pt (and of train --test); M2 uses 5


@dataclass
class TrainConfig:
    preset: str
    model: dict[str, Any]  # CaptionerConfig overrides
    data: DataSection
    optim: OptimSection = field(default_factory=OptimSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    scst: SCSTSection = field(default_factory=SCSTSection)
    run: RunSection = field(default_factory=RunSection)
    source: str = ""  # the file it came from
    text: str = ""  # its verbatim text (copied into the run directory)
    # hook name -> its section ([prototypes], [retrieval]): one per registered training hook
    hook_sections: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.hook_sections = {name: self.hook_sections.get(name) or cls()
                              for name, cls in hook_sections_classes().items()}

    def __getattr__(self, name: str):
        """A training hook's section by its name: `cfg.retrieval.index`."""
        sections = self.__dict__.get("hook_sections") or {}
        if name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def phases(self) -> list[str]:
        """The phases this run trains, in order: "xe", then "scst"."""
        return [p for p, n in (("xe", self.schedule.epochs), ("scst", self.scst.epochs)) if n > 0]

    def phase_epochs(self, phase: str) -> int:
        return self.schedule.epochs if phase == "xe" else self.scst.epochs

    def patience(self, phase: str) -> int:
        return self.schedule.patience if phase == "xe" else self.scst.patience

    def batch_size(self, phase: str) -> int:
        return (self.scst.batch_size or self.data.batch_size) if phase == "scst" else self.data.batch_size

    def model_config(self, vocab_size: int, special_ids: dict[str, int] | None = None):
        from edgecap.models import preset_config

        overrides = _merged(self.derived_model_fields(), self.model)
        overrides["vocab_size"] = vocab_size
        for role, idx in (special_ids or {}).items():
            overrides[f"{role}_id"] = idx
        return preset_config(self.preset, **overrides)

    def with_visual_weights(self, path: str) -> TrainConfig:
        """The config with [model].visual.weights = path (`edgecap train --visual-weights`)."""
        from edgecap.models.frontends import FRONT_END_KINDS

        visual = self.model.get("visual") if isinstance(self.model.get("visual"), dict) else {}
        if visual.get("kind") not in FRONT_END_KINDS:
            raise EdgecapError(
                f"--visual-weights needs a real-size front end in [model].visual (kind = "
                f"{' | '.join(repr(k) for k in FRONT_END_KINDS)}), not {visual.get('kind', 'the preset default')!r}"
            )
        from edgecap.models.pretrained import resolve_weights

        resolve_weights(path, visual.get("weights_sha256", ""), what="--visual-weights")
        return dataclasses.replace(self, model={**self.model, "visual": {**visual, "weights": str(path)}})

    def with_paths_from(self, started_in: str | os.PathLike | None) -> TrainConfig:
        """The config with every file it reads resolved for a run started in `started_in`
        (edgecap.config_paths); a file that is not there is a one-line error naming its key.
        `[data.synth].dir` may not exist yet (the world is generated there)."""
        where = self.source or "config"
        from edgecap.models.pretrained import is_packaged

        config = self.source if self.source and Path(self.source).is_file() else None

        def existing(value: str, key: str) -> str:
            if not value:
                return value
            return str(existing_from_run_start(value, started_in, f"{where}: {key}", config, DATA_SOURCES.get(key, "")))

        d = self.data
        synth = d.synth
        if synth is not None and synth.dir:
            synth = dataclasses.replace(synth, dir=str(from_run_start(synth.dir, started_in)))
        data = dataclasses.replace(d, karpathy=existing(d.karpathy, "[data].karpathy"),
                                   images=existing(d.images, "[data].images"),
                                   features=existing(d.features, "[data].features"), synth=synth)
        hooks = {name: dataclasses.replace(section, **{
                     f.name: existing(getattr(section, f.name), f"[{name}].{f.name}")
                     for f in dataclasses.fields(section) if f.metadata.get("path")})
                 for name, section in self.hook_sections.items()}
        run = dataclasses.replace(self.run, init_from=existing(self.run.init_from, "[run].init_from"))
        model = self.model
        visual = model.get("visual")
        if isinstance(visual, dict) and visual.get("weights") and not is_packaged(visual["weights"]):
            model = {**model, "visual": {**visual, "weights": existing(visual["weights"], "[model].visual.weights")}}
        return dataclasses.replace(self, data=data, hook_sections=hooks, model=model, run=run)

    def derived_model_fields(self) -> dict:
        """Model fields that follow from the front end or the features file, unless [model]
        sets them: a real-size front end gives d_in, n_regions, sinusoidal positions and its
        weights' preprocessing (`frontend_overrides`); an HDF5 file written by `edgecap
        features extract` gives its grid (`n_regions`, `dim`), so training on cached features
        builds the same captioner as training with the front end on the fly."""
        visual = self.model.get("visual") or {}
        if not isinstance(visual, dict):
            return {}
        from edgecap.models.factory import preset_config, takes_images
        from edgecap.models.frontends import FRONT_END_KINDS

        if visual.get("kind") in FRONT_END_KINDS:
            from edgecap.models.frontends import frontend_overrides

            return frontend_overrides(visual.get("backbone", ""), int(visual.get("image_size", 0) or 0),
                                      visual.get("weights", ""), visual.get("weights_sha256", ""), kind=visual["kind"])
        made = self.features_provenance()
        if made and not takes_images(visual.get("kind") or preset_config(self.preset).visual.kind):
            return {"d_in": int(made["dim"]), "n_regions": int(made["n_regions"]), "encoder_positions": "sinusoidal"}
        return {}

    def features_provenance(self) -> dict:
        """The attributes `edgecap features extract` wrote into [data].features ({} otherwise)."""
        path = self.data.features
        if not path or not Path(path).is_file():
            return {}
        from edgecap.data.features import FeatureStore

        with FeatureStore(path) as store:
            attrs = store.attrs
        keys = ("kind", "backbone", "weights_sha256", "preprocessing", "tokens", "n_regions", "dim")
        return {k: attrs[k] for k in keys if k in attrs} if "dim" in attrs and "n_regions" in attrs else {}

    def to_dict(self) -> dict:
        out = {"model": {"preset": self.preset, **self.model}}
        for name in CORE_SECTIONS[1:]:
            out[name] = dataclasses.asdict(getattr(self, name))
        for name, section in self.hook_sections.items():
            out[name] = dataclasses.asdict(section)
        return out


def hook_sections_classes() -> dict[str, type]:
    """The training hooks' config sections, name -> dataclass (edgecap.train.hook)."""
    from edgecap.train.hook import sections

    return sections()


def section_names() -> tuple[str, ...]:
    """Every section a training config may have: the trainer's own, then the hooks'."""
    return (*CORE_SECTIONS, *hook_sections_classes())


def _merged(base: dict, over: dict) -> dict:
    """`over` on top of `base`, nested tables merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


CORE_SECTIONS = ("model", "data", "optim", "schedule", "scst", "run")
# what an optional value (default None, "unset") must be when set, by its annotation
_OPTIONAL = {"int | None": 0, "bool | None": False, "float | None": 0.0, "str | None": ""}


def _section(cls, table, where: str):
    if not isinstance(table, dict):
        raise EdgecapError(f"{where}: expected a table, got {type(table).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    defaults = cls()
    kwargs = {}
    for key, value in table.items():
        if key not in fields:
            raise EdgecapError(
                f"{where}: unknown key {key!r}{did_you_mean(key, fields)}; valid keys: {', '.join(fields)}"
            )
        if cls is DataSection and key == "synth":
            kwargs[key] = _section(SynthSection, value, f"{where}.synth")
            continue
        default = getattr(defaults, key)
        if default is None:
            default = _OPTIONAL.get(str(fields[key].type))
        kwargs[key] = typed(value, default, f"{where}.{key}")
    return cls(**kwargs)


def choice(value: str, choices, where: str) -> None:
    if value not in choices:
        raise EdgecapError(f"{where} = {value!r}{did_you_mean(value, choices)}; expected one of {', '.join(choices)}")


def positive(value, where: str, zero_ok: bool = False) -> None:
    if value < 0 or (value == 0 and not zero_ok):
        raise EdgecapError(f"{where} = {value!r}: expected {'>= 0' if zero_ok else '> 0'}")


def parse_config(data: dict, source: str = "<config>", text: str = "") -> TrainConfig:
    where = source
    hooks = hook_sections_classes()
    names = (*CORE_SECTIONS, *hooks)
    unknown = [k for k in data if k not in names]
    if unknown:
        k = unknown[0]
        raise EdgecapError(f"{where}: unknown section [{k}]{did_you_mean(k, names)}; valid: {', '.join(names)}")
    for name, value in data.items():
        if not isinstance(value, dict):
            raise EdgecapError(f"{where}: {name} = {value!r:.60} is not a section: expected a [{name}] table"
                               + (' with preset = "<name>" (see `edgecap models`)' if name == "model" else ""))
    model = dict(data.get("model") or {})
    if "preset" not in model:
        raise EdgecapError(f"{where}: [model] needs preset = \"<name>\" (see `edgecap models`)")
    preset = model.pop("preset")
    if not isinstance(preset, str):
        raise EdgecapError(f"{where}: [model].preset = {preset!r}: expected a string")
    if "vocab_size" in model:
        raise EdgecapError(f"{where}: [model].vocab_size is set from the training vocabulary; remove it")
    if "data" not in data:
        raise EdgecapError(f"{where}: missing section [data]")
    cfg = TrainConfig(
        preset=preset,
        model=model,
        data=_section(DataSection, data["data"], f"{where}: [data]"),
        optim=_section(OptimSection, data.get("optim", {}), f"{where}: [optim]"),
        schedule=_section(ScheduleSection, data.get("schedule", {}), f"{where}: [schedule]"),
        scst=_section(SCSTSection, data.get("scst", {}), f"{where}: [scst]"),
        run=_section(RunSection, data.get("run", {}), f"{where}: [run]"),
        source=source,
        text=text,
        hook_sections={name: _section(cls, data.get(name, {}), f"{where}: [{name}]") for name, cls in hooks.items()},
    )
    _validate(cfg, where)
    return cfg


def _validate(cfg: TrainConfig, where: str) -> None:
    d = cfg.data
    if d.synth is None and not d.karpathy:
        raise EdgecapError(f"{where}: [data] needs karpathy = \"dataset_coco.json\" or a [data.synth] table")
    if d.synth is not None and (d.karpathy or d.images or d.features):
        raise EdgecapError(f"{where}: [data.synth] generates its own data; remove karpathy/images/features")
    if d.karpathy and bool(d.images) == bool(d.features):
        raise EdgecapError(f"{where}: [data] needs exactly one of images = \"DIR\" or features = \"FILE.h5\"")
    choice(d.augment, ("none", "shift"), f"{where}: [data].augment")
    for name in ("batch_size", "val_batch_size", "min_count"):
        positive(getattr(d, name), f"{where}: [data].{name}")
    for name in ("val_images", "num_workers", "shift_pixels"):
        positive(getattr(d, name), f"{where}: [data].{name}", zero_ok=True)
    if d.synth is not None:
        positive(d.synth.images, f"{where}: [data.synth].images")
        choice(d.synth.image_format, ("jpg", "png"), f"{where}: [data.synth].image_format")
    choice(cfg.optim.optimizer, OPTIMIZERS, f"{where}: [optim].optimizer")
    choice(cfg.scst.optimizer, OPTIMIZERS, f"{where}: [scst].optimizer")
    positive(cfg.optim.lr, f"{where}: [optim].lr")
    s = cfg.schedule
    choice(s.kind, SCHEDULES, f"{where}: [schedule].kind")
    positive(s.epochs, f"{where}: [schedule].epochs", zero_ok=True)
    positive(s.warmup, f"{where}: [schedule].warmup", zero_ok=s.kind != "noam")
    positive(s.decay_every, f"{where}: [schedule].decay_every")
    choice(cfg.scst.baseline, BASELINES, f"{where}: [scst].baseline")
    positive(cfg.scst.epochs, f"{where}: [scst].epochs", zero_ok=True)
    positive(s.patience, f"{where}: [schedule].patience", zero_ok=True)
    positive(cfg.scst.patience, f"{where}: [scst].patience", zero_ok=True)
    positive(cfg.scst.beam_size, f"{where}: [scst].beam_size")
    positive(cfg.scst.lr, f"{where}: [scst].lr")
    if cfg.scst.baseline == "mean" and cfg.scst.beam_size < 2 and cfg.scst.epochs:
        raise EdgecapError(f"{where}: [scst].baseline = \"mean\" needs beam_size >= 2 (the mean of one reward is itself)")
    if s.epochs == 0 and cfg.scst.epochs == 0:
        raise EdgecapError(f"{where}: nothing to train: [schedule].epochs and [scst].epochs are both 0")
    choice(cfg.run.device, ("auto", "cpu", "cuda"), f"{where}: [run].device")
    positive(cfg.run.log_every, f"{where}: [run].log_every")
    positive(cfg.run.val_beam, f"{where}: [run].val_beam")
    positive(cfg.run.average_last, f"{where}: [run].average_last", zero_ok=True)
    # The model section: build the config once so a bad preset / field fails now, not later.
    try:
        from edgecap.models.factory import check_parts

        model_cfg = cfg.model_config(vocab_size=100)
        check_parts(model_cfg)
    except EdgecapError as exc:
        raise EdgecapError(f"{where}: [model]: {exc}") from None
    _validate_hooks(cfg, model_cfg, where)


def _validate_hooks(cfg: TrainConfig, model_cfg, where: str) -> None:
    """Each hook of the preset checks its section; a section of a hook it lacks must be unset."""
    from edgecap.train.hook import HOOKS, hook_classes

    used = {cls.name for cls in hook_classes(model_cfg)}
    for name, section in cfg.hook_sections.items():
        hook = HOOKS.get(name)
        if name in used:
            hook.check(section, model_cfg, where)
        elif section != type(section)():
            raise EdgecapError(f"{where}: [{name}] is set but preset {cfg.preset!r} {hook.unused}")


def to_toml(data: dict) -> str:
    """A minimal TOML writer for configs built in code (tables of scalars, lists, sub-tables)."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items() if x is not None) + " }"
        raise TypeError(type(v))

    lines = []
    for section, table in data.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in table.items() if v is not None]
        lines.append("")
    return "\n".join(lines)
