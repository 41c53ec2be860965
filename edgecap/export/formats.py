"""FORMATS: the one table of export engines. CLI choices, option checks and benchmarks read it.

Each row says what an engine writes (suffix), where it runs, which precisions it builds and
which options it takes; `resolve_settings` merges engine defaults < target preset < command
line and refuses an option the engine does not take, listing the ones it does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from edgecap.argtypes import BATCH, BEAM, Integer
from edgecap.errors import EdgecapError, did_you_mean
from edgecap.jsonio import read_toml

SUPPORTED_OPSETS = (17, 18, 19, 20)
DEFAULT_OPSET = 17  # the oldest opset with LayerNormalization; TensorRT 8.6+ parses it

# options every engine takes (command-line flag names without dashes, underscores as in args)
COMMON_OPTIONS = ("target", "batch", "beam", "precision", "opset", "out", "force", "exporter", "samples", "data",
                  "frontend", "visual_weights", "image_size")


@dataclass(frozen=True)
class Format:
    name: str
    title: str
    suffix: str
    runtime: str  # the manifest `engine` of the graphs it adds
    device: str
    precisions: tuple[str, ...]
    options: tuple[str, ...]  # options beyond COMMON_OPTIONS
    requires: str  # Python module needed to build
    extra: str  # pip extra that installs it
    defaults: dict = field(default_factory=dict)

    @property
    def allowed(self) -> tuple[str, ...]:
        return COMMON_OPTIONS + self.options


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(
            name="onnx",
            title="ONNX graphs for onnxruntime",
            suffix=".onnx",
            runtime="onnxruntime",
            device="cpu, cuda (onnxruntime providers)",
            precisions=("fp32", "fp16", "int8"),
            options=("quantize", "calibration"),
            requires="onnxruntime",
            extra="train",
            defaults={"quantize": "dynamic"},
        ),
        Format(
            name="trt",
            title="TensorRT engines built from the ONNX graphs (TensorRT or TensorRT for RTX)",
            suffix=".engine",
            runtime="tensorrt",
            device="cuda (NVIDIA GPU, Jetson; TensorRT for RTX: Ampere, Ada, Blackwell RTX)",
            precisions=("fp32", "fp16", "int8"),
            options=("tensorrt", "workspace", "timing_cache", "int8_mode"),
            requires="tensorrt",  # or tensorrt_rtx: edgecap.runtime.tensorrt_dist chooses
            extra="trt",
            defaults={"tensorrt": "auto", "workspace": 1024, "timing_cache": "", "int8_mode": "qdq"},
        ),
    )
}

CHOICES = {
    "precision": ("fp32", "fp16", "int8"),
    "exporter": ("torchscript", "dynamo"),
    "quantize": ("dynamic", "static", "weight-only"),
    "int8_mode": ("qdq", "calibrator"),
    "tensorrt": ("auto", "tensorrt", "tensorrt-rtx"),  # edgecap.runtime.tensorrt_dist.CHOICES
}
# parity inputs by default: enough that "100% identical" means something (held-out images
# first; a dataset with fewer real images has them all, edgecap.export.verify)
PARITY_SAMPLES = 32
# the sizes a flag or a preset sets: the flags' argparse types (edgecap.argtypes)
SIZES = {"batch": BATCH, "beam": BEAM, "samples": Integer(1, 10_000), "workspace": Integer(16, 2**20)}

BASE_DEFAULTS = {
    "batch": 1, "beam": 3, "precision": "fp32", "opset": DEFAULT_OPSET, "exporter": "torchscript",
    "samples": PARITY_SAMPLES, "data": "", "out": "", "force": False, "target": "",
    "frontend": "", "visual_weights": "", "image_size": 0,
}


@dataclass
class ExportSettings:
    engine: str
    batch: int = 1
    beam: int = 3
    precision: str = "fp32"
    opset: int = DEFAULT_OPSET
    exporter: str = "torchscript"
    samples: int = PARITY_SAMPLES
    data: str = ""
    out: str = ""
    force: bool = False
    target: str = ""
    quantize: str = "dynamic"
    workspace: int = 1024  # MiB
    tensorrt: str = "auto"  # which TensorRT builds: tensorrt, tensorrt-rtx (TensorRT for RTX), auto: the first that imports
    timing_cache: str = ""
    int8_mode: str = "qdq"
    calibration: str = ""  # images calibrating a convolutional front end's static int8 ("" = synthetic world)
    frontend: str = ""  # attach this front end to a captioner trained on its cached features
    visual_weights: str = ""  # the front end's weights file ("" = its seeded random weights)
    image_size: int = 0  # the front end's input size (0 = the features' / weights' own)

    @property
    def format(self) -> Format:
        return FORMATS[self.engine]


def flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise EdgecapError(f"unknown engine {name!r}{did_you_mean(name, FORMATS)}; engines: {', '.join(FORMATS)}")
    return FORMATS[name]


# -- target presets (export/*.toml at the repository root) --------------------------------------
def installed_preset_dir() -> Path | None:
    """Where a pip-installed edgecap keeps the presets (pyproject's data-files: <prefix>/share/
    edgecap/export, wherever the install scheme put <prefix>), or None."""
    from importlib import metadata

    try:
        files = metadata.distribution("edgecap").files or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.suffix == ".toml" and file.parts[-4:-1] == ("share", "edgecap", "export"):
            return Path(file.locate()).resolve().parent
    return None


def preset_dirs() -> list[Path]:
    """export/ in the current directory, then the checkout's, then the installed copy."""
    checkout = Path(__file__).resolve().parents[2] / "export"
    dirs = [Path.cwd() / "export", checkout, installed_preset_dir()]
    return list(dict.fromkeys(d for d in dirs if d is not None and d.is_dir()))


def list_presets() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in reversed(preset_dirs()):
        for path in sorted(folder.glob("*.toml")):
            found[path.stem] = path
    return found


def load_preset(name: str) -> tuple[str, dict]:
    """(name, options) of a preset named in export/ or given as a path to a .toml file."""
    path = Path(name)
    if not (name.endswith(".toml") and path.is_file()):
        presets = list_presets()
        if name not in presets:
            raise EdgecapError(
                f"unknown target {name!r}{did_you_mean(name, presets)}; targets: {', '.join(presets) or '(none found)'}"
            )
        path = presets[name]
    data = read_toml(path, where=f"target preset {path}")
    data.pop("description", None)
    known = {f.name for f in fields(ExportSettings)} - {"target", "force", "out", "frontend", "visual_weights",
                                                        "image_size"}
    for key in data:
        if key not in known:
            raise EdgecapError(f"target preset {path}: unknown key {key!r}{did_you_mean(key, known)}; keys: {', '.join(sorted(known))}")
    return path.stem, data


def resolve_settings(cli: dict) -> ExportSettings:
    """Merge engine defaults < preset < command line; refuse options the engine does not take.

    `cli` holds the parsed arguments, None for each option the user did not give.
    """
    cli = {k: v for k, v in cli.items() if v is not None and v is not False}
    preset_name, preset = ("", {})
    if cli.get("target"):
        preset_name, preset = load_preset(cli["target"])
    engine = cli.get("engine") or preset.get("engine")
    if not engine:
        raise EdgecapError(f"choose an engine with --engine ({'|'.join(FORMATS)}) or a --target preset")
    fmt = get_format(engine)
    if preset.get("engine") and cli.get("engine") and preset["engine"] != cli["engine"]:
        raise EdgecapError(f"--engine {cli['engine']} contradicts target {preset_name!r}, which is for engine {preset['engine']!r}")
    allowed = set(fmt.allowed) | {"engine"}
    for source, options in (("target " + repr(preset_name), preset), ("command line", cli)):
        for key in options:
            if key not in allowed:
                takes = ", ".join(flag(o) for o in fmt.allowed)
                where = "" if source == "command line" else f" (from {source})"
                raise EdgecapError(f"engine {engine!r} does not take {flag(key)}{where}; it takes: {takes}")
    merged = {**BASE_DEFAULTS, **fmt.defaults, **preset, **cli, "engine": engine, "target": preset_name}
    settings = ExportSettings(**{k: v for k, v in merged.items() if k in {f.name for f in fields(ExportSettings)}})
    _validate(settings, fmt)
    _refuse_int8_options(settings, preset_name, preset, cli)
    return settings


INT8_OPTIONS = ("quantize", "calibration")  # options that mean something at --precision int8 only


def _refuse_int8_options(s: ExportSettings, preset_name: str, preset: dict, cli: dict) -> None:
    """An int8 option given for another precision would be ignored: refused instead. A preset's
    int8 options are its own only while the command line keeps its precision."""
    if s.precision == "int8":
        return
    preset_int8 = preset.get("precision") == "int8"
    for key in INT8_OPTIONS:
        if key in cli or (key in preset and not preset_int8 and "precision" not in cli):
            where = "" if key in cli else f" (from target {preset_name!r})"
            raise EdgecapError(f"{flag(key)} {getattr(s, key)}{where} applies to --precision int8, and this export is "
                               f"{s.precision}: add --precision int8 or drop {flag(key)}")


def _validate(s: ExportSettings, fmt: Format) -> None:
    for key, choices in CHOICES.items():
        value = getattr(s, key)
        if value not in choices:
            raise EdgecapError(f"{flag(key)} {value!r}: expected one of {', '.join(choices)}{did_you_mean(value, choices)}")
    if s.precision not in fmt.precisions:
        raise EdgecapError(f"engine {fmt.name!r} builds {', '.join(fmt.precisions)}, not {s.precision!r}")
    if s.opset not in SUPPORTED_OPSETS:
        raise EdgecapError(
            f"--opset {s.opset} is not supported: choose one of {', '.join(map(str, SUPPORTED_OPSETS))} "
            f"(static graphs with LayerNormalization need >= 17)"
        )
    if s.exporter == "dynamo" and s.opset < 18:
        raise EdgecapError(f"--exporter dynamo writes opset >= 18, not {s.opset}; pass --opset 18")
    for key, kind in SIZES.items():  # the flags' own types, again for a preset's values
        kind.check(getattr(s, key), flag(key))
    if s.visual_weights and not s.frontend:
        raise EdgecapError("--visual-weights names the weights of a --frontend; pass --frontend NAME too")
    if s.image_size and not s.frontend:
        raise EdgecapError("--image-size sets the input size of a --frontend; pass --frontend NAME too")
    if isinstance(s.image_size, bool) or not isinstance(s.image_size, int) or s.image_size < 0:
        raise EdgecapError(f"--image-size {s.image_size!r}: expected a positive integer")
    if s.data and not os.path.isdir(s.data):
        raise EdgecapError(f"--data {s.data}: not a directory")
    if s.calibration and not os.path.isdir(s.calibration):
        raise EdgecapError(f"--calibration {s.calibration}: not a directory (expected a folder of images)")
