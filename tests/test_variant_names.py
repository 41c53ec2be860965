"""No module tests a variant's name outside that variant's own files.

A variant (an attention module, a decoder, a visual front end) is known elsewhere only by what
its class declares (`training_hook`, `export_spec`, `takes_images`, `splits_heads`, ...), never
by a comparison such as `cfg.decoder_self_attention == "prototype"`: adding a family then
touches no trainer, config or export code. Found by reading every module's syntax tree for a
comparison of a field that names a part (or a family, or a preset) with one of those names.

The loop every source runs through and the ROS node's methods stay short enough to read at once
(at most 60 lines each), so the one loop is one screen, not a maze of special cases.
"""

import ast
import sys
from pathlib import Path

from edgecap.export.specs import EXPORT_SPECS
from edgecap.models import preset_config
from edgecap.models.registry import (
    CROSS_ATTENTION,
    DECODER_SELF_ATTENTION,
    DECODERS,
    ENCODER_ATTENTION,
    VISUAL,
    list_models,
)
from edgecap.train.hook import HOOKS

REPO = Path(__file__).resolve().parents[1]
PART_REGISTRIES = (ENCODER_ATTENTION, DECODER_SELF_ATTENTION, CROSS_ATTENTION, DECODERS, VISUAL)
# config fields (and the names code reads them into) whose value names a part, a family or a preset
NAMING_FIELDS = {"decoder", "encoder_attention", "decoder_self_attention", "cross_attention", "kind", "family",
                 "preset", "name", "attention"}


def _file(module: str) -> str:
    return str(Path(sys.modules[module].__file__).resolve().relative_to(REPO))


def own_files() -> dict[str, set[str]]:
    """Variant name -> the files that may test it: the module registering it, its training
    hook's module and its export spec's module."""
    owners: dict[str, set[str]] = {}
    for registry in PART_REGISTRIES:
        for name in registry.names():
            cls = registry.get(name)
            files = owners.setdefault(name, set())
            files.add(_file(cls.__module__))
            if getattr(cls, "training_hook", ""):
                files.add(_file(HOOKS.get(cls.training_hook).__module__))
            if getattr(cls, "export_spec", ""):
                files.add(_file(EXPORT_SPECS.get(cls.export_spec).__module__))
    for preset in list_models():  # families and presets are JSON files: no module owns them
        owners.setdefault(preset, set())
        owners.setdefault(preset_config(preset).family, set())
    return owners


def _field(node) -> str | None:
    """The field an expression reads: `cfg.visual.kind` -> kind, `kind` -> kind,
    `table["kind"]` / `table.get("kind", ...)` -> kind."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args \
            and isinstance(node.args[0], ast.Constant):
        return node.args[0].value
    return None


def _strings(node) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for element in node.elts for s in _strings(element)]
    return []


def name_tests(source: str, names) -> list[tuple[int, str]]:
    """(line, variant name) of every comparison of a naming field with a variant's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        fields = {_field(side) for side in sides} & NAMING_FIELDS
        if fields:
            found += [(node.lineno, s) for side in sides for s in _strings(side) if s in names]
    return found


def test_the_reader_finds_the_tests_it_is_meant_to_find():
    names = {"prototype", "knn", "features"}
    src = ('if cfg.decoder_self_attention == "prototype": pass\n'
           'if "knn" != model_cfg.decoder_self_attention: pass\n'
           'if visual.get("kind", "features") == "features": pass\n'
           'if kind in ("features", "cnn"): pass\n'
           'if self.input == "features": pass\n')  # the manifest's input kind, not a front end's name
    assert name_tests(src, names) == [(1, "prototype"), (2, "knn"), (3, "features"), (4, "features")]


def test_no_module_tests_a_variants_name_outside_its_own_files():
    owners = own_files()
    bad = []
    for path in sorted((REPO / "edgecap").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        for line, name in name_tests(path.read_text(encoding="utf-8"), owners):
            if rel not in owners[name]:
                bad.append(f"{rel}:{line} tests the name {name!r}")
    assert bad == []


LOOP_MODULES = ("edgecap/runtime/execute.py", "edgecap/runtime/loop.py", "edgecap/ros2/node.py")
LONGEST_LOOP_FUNCTION = 60


def test_the_loop_and_the_ros_nodes_methods_are_each_at_most_60_lines():
    repo = Path(__file__).resolve().parents[1]
    long_ones, seen = [], set()
    for rel in LOOP_MODULES:
        for node in ast.walk(ast.parse((repo / rel).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                seen.add(node.name)
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_LOOP_FUNCTION:
                    long_ones.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    assert {"execute", "plan_run"} <= seen, "the loop's entry points moved: update LOOP_MODULES"
    assert not long_ones, long_ones
