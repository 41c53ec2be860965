"""Command-line changes to a training config: `--set section.key=value` and `--data DIR`.

    edgecap train --config configs/demo-tabletop.toml --set schedule.epochs=2 --set data.batch_size=32
    edgecap train --config configs/demo-tabletop.toml --data data/my-tabletop --set model.memory.slots=8

Keys are dotted paths of the config schema (`model.*` are CaptionerConfig fields, nested ones
such as `model.visual.image_size` included; `prototypes.*`, `retrieval.*` a training hook's section). Each
value is read as the type of the field it sets: integers, numbers, true / false, strings as
written (quotes optional), lists as `[a, b]` or `a,b`. An unknown key or a value of the wrong
type is a one-line error naming the --set it came from. The changed config is what the run
directory's config.toml records, so `--resume` compares against it.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from edgecap.errors import EdgecapError, did_you_mean
from edgecap.jsonio import read_text
from edgecap.train.config import (
    DataSection,
    OptimSection,
    RunSection,
    ScheduleSection,
    SCSTSection,
    SynthSection,
    TrainConfig,
    hook_sections_classes,
    parse_config,
    section_names,
    to_toml,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

UNTYPED = object()  # a field whose default does not tell its type (e.g. None)


def _section_classes() -> dict[str, type]:
    """Every section but [model]: the trainer's own, then each training hook's."""
    return {"data": DataSection, "optim": OptimSection, "schedule": ScheduleSection, "scst": SCSTSection,
            "run": RunSection, **hook_sections_classes()}


def _fields(node) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        out[f.name] = value if value is not None else UNTYPED
    return out


def schema_default(key: str, where: str):
    """The default of the config field `key` names (its type checks the new value)."""
    from edgecap.models.config import CaptionerConfig

    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        raise EdgecapError(f"{where}: expected section.key=value, e.g. schedule.epochs=3")
    section, sections = parts[0], section_names()
    if section not in sections:
        raise EdgecapError(f"{where}: unknown section {section!r}{did_you_mean(section, sections)}; "
                           f"sections: {', '.join(sections)}")
    if section == "model" and parts[1] == "preset" and len(parts) == 2:
        return ""
    table: dict[str, Any]
    if section == "model":
        model = CaptionerConfig()
        table = {**_fields(model), **model.sections}  # each variant's section is a table of its own
        table.pop("sections")
        table.pop("vocab_size")  # set from the training vocabulary
    else:
        table = _fields(_section_classes()[section]())
        if section == "data":
            table["synth"] = SynthSection()
    path = section
    for i, part in enumerate(parts[1:], start=1):
        if part not in table:
            raise EdgecapError(f"{where}: {path} has no key {part!r}{did_you_mean(part, table)}; "
                               f"keys: {', '.join(table)}")
        value = table[part]
        path = f"{path}.{part}"
        if dataclasses.is_dataclass(value):
            if i == len(parts) - 1:
                first = next(iter(_fields(value)))
                raise EdgecapError(f"{where}: {path} is a table; set one of its keys, e.g. {path}.{first}=...")
            table = _fields(value)
            continue
        if i != len(parts) - 1:
            raise EdgecapError(f"{where}: {path} is a value, not a table")
        return value
    raise AssertionError("unreachable")


def _literal(raw: str):
    """A TOML value (number, bool, list, quoted string); anything else is the text itself."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def coerce(raw: str, default, where: str):
    """`raw` read as the type of `default`."""
    text = raw.strip()
    if isinstance(default, bool):
        if text.lower() not in ("true", "false"):
            raise EdgecapError(f"{where}: expected true or false")
        return text.lower() == "true"
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise EdgecapError(f"{where}: expected an integer") from None
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise EdgecapError(f"{where}: expected a number") from None
    if isinstance(default, str):
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
            return _literal(text) if text[0] == '"' else text[1:-1]
        return raw
    if isinstance(default, tuple):
        items = _literal(text) if text.startswith("[") else [t for t in text.split(",") if t.strip()]
        if not isinstance(items, list):
            raise EdgecapError(f"{where}: expected a list, e.g. [1, 2]")
        element = default[0] if default else UNTYPED
        return [coerce(str(v).lower() if isinstance(v, bool) else str(v), element, where) for v in items]
    return _literal(text)


def apply_set(data: dict, assignment: str) -> str:
    """Apply one `key=value` to the raw config tables; returns the key."""
    where = f"--set {assignment}"
    if "=" not in assignment:
        raise EdgecapError(f"{where}: expected section.key=value, e.g. schedule.epochs=3")
    key, raw = (part.strip() for part in assignment.split("=", 1))
    value = coerce(raw, schema_default(key, where), where)
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value
    return key


def apply_data_dir(data: dict, folder: str | Path) -> str | None:
    """Point the config's [data] at a dataset folder: dataset_coco.json plus images/ (the
    `edgecap data synth` layout) or the image root itself, or, for a model that reads
    precomputed features, the HDF5 file in it: the one the config names if the folder has a
    file of that name, else the folder's only .h5 / .hdf5 file. Replaces any [data.synth]
    world. -> the error to give when no features file was chosen and no later
    `--set data.features=FILE` names one (None when nothing is missing)."""
    from edgecap.models.factory import preset_config, takes_images

    folder = Path(folder)
    karpathy = folder / "dataset_coco.json"
    if not folder.is_dir():
        raise EdgecapError(f"--data {folder}: not a directory")
    if not karpathy.is_file():
        raise EdgecapError(f"--data {folder}: no dataset_coco.json (expected a Karpathy split JSON beside "
                           "images/, as `edgecap data synth` writes)")
    model = dict(data.get("model") or {})
    preset = model.pop("preset", None)
    if not isinstance(preset, str):
        raise EdgecapError("--data: the config's [model] needs preset = \"<name>\"")
    model.pop("vocab_size", None)
    reads_features = not takes_images(preset_config(preset, **model).visual.kind)
    section = data.setdefault("data", {})
    named = section.get("features")
    for key in ("synth", "images", "features"):
        section.pop(key, None)
    section["karpathy"] = str(karpathy)
    if reads_features:
        same_name = folder / Path(str(named)).name if isinstance(named, str) and named else None
        found = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".h5", ".hdf5") and p.is_file())
        if same_name is not None and same_name.is_file():
            section["features"] = str(same_name)
        elif len(found) == 1:
            section["features"] = str(found[0])
        else:
            what = (f"{len(found)} HDF5 files ({', '.join(p.name for p in found[:4])})" if found
                    else "no .h5 / .hdf5 file")
            example = shlex.quote(str(folder / "features.h5"))
            return (f"--data {folder}: the model reads precomputed features and the folder holds {what}; "
                    f"name the file with --set data.features=FILE (or: edgecap features extract ... --out {example})")
        return None
    section["images"] = str(folder / "images" if (folder / "images").is_dir() else folder)
    return None


def load_config(path: str | os.PathLike, overrides: tuple[str, ...] | list[str] = (),
                data_dir: str | os.PathLike | None = None) -> TrainConfig:
    """Read a TOML config; `data_dir` (--data) and `overrides` (--set key=value, applied after
    it) change it first (apply_data_dir, apply_set below). A changed config's `text` is the TOML of
    the result, which the run directory keeps."""
    path = Path(path)
    if not path.is_file():
        raise EdgecapError(f"config {path} does not exist")
    text = read_text(path, where=f"config {path}")  # drops Windows Notepad's BOM, which tomllib refuses
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise EdgecapError(f"config {path}: not valid TOML ({exc})") from exc
    if not overrides and data_dir is None:
        return parse_config(data, source=str(path), text=text)
    changes, missing = [], None
    if data_dir is not None:
        missing = apply_data_dir(data, data_dir)
        changes.append(f"--data {data_dir}")
    for assignment in overrides:
        apply_set(data, assignment)
        changes.append(f"--set {assignment}")
    if missing and not (data.get("data") or {}).get("features"):
        raise EdgecapError(missing)
    try:
        cfg = parse_config(data, source=str(path))
    except EdgecapError as exc:
        raise EdgecapError(f"{exc} (after {' '.join(changes)})") from None
    cfg.text = f"# {path} with {' '.join(changes)}\n" + to_toml(cfg.to_dict())
    return cfg
