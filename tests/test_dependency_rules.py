"""The robot side (edgecap.runtime, edgecap.metrics) must import without torch."""

import json
import subprocess
import sys

import pytest

PROBE = r"""
import importlib, json, pkgutil, sys
loaded = []
for pkg_name in {packages!r}:
    pkg = importlib.import_module(pkg_name)
    loaded.append(pkg_name)
    for info in pkgutil.walk_packages(pkg.__path__, pkg_name + "."):
        importlib.import_module(info.name)
        loaded.append(info.name)
heavy = sorted(m for m in ("torch", "open_clip", "torchvision", "edgecap.models", "edgecap.train",
                           "edgecap.export") if m in sys.modules)
print(json.dumps({{"loaded": loaded, "heavy": heavy}}))
"""


@pytest.mark.parametrize("packages", [["edgecap.runtime"], ["edgecap.metrics"], ["edgecap.ros"], ["edgecap.ros2"],
                                      ["edgecap.runtime", "edgecap.metrics"]])
def test_robot_side_imports_no_torch(packages):
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(packages=packages)], capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loaded"], "nothing was imported"
    assert report["heavy"] == [], f"importing {packages} loaded {report['heavy']}"


def test_cli_help_imports_no_torch():
    code = (
        "import sys\nfrom edgecap.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


# Every import statement, including those inside functions: a lazy import of the torch side
# from the runtime still makes a robot install torch for that code path.
FORBIDDEN = {
    "edgecap/runtime": ("torch", "open_clip", "torchvision", "edgecap.models", "edgecap.train", "edgecap.export"),
    "edgecap/metrics": ("torch", "open_clip", "torchvision", "edgecap.models", "edgecap.train", "edgecap.export"),
    # ROS message conversion and log I/O: shared by the runtime and the ROS 2 node, below both.
    "edgecap/ros": ("torch", "open_clip", "torchvision", "edgecap.models", "edgecap.train", "edgecap.export",
                    "edgecap.runtime", "edgecap.data"),
    # the ROS 2 node: above the runtime and edgecap.ros, on the robot
    "edgecap/ros2": ("torch", "open_clip", "torchvision", "edgecap.models", "edgecap.train", "edgecap.export"),
    # the JSON / JSON Lines reader below the runtime's and the metrics' readers
    "edgecap/jsonio.py": ("torch", "open_clip", "torchvision", "edgecap.models", "edgecap.train", "edgecap.export",
                          "edgecap.runtime", "edgecap.data", "edgecap.metrics", "edgecap.retrieval"),
    # the command-line value types every command parses with, the runtime's included
    "edgecap/argtypes.py": ("torch", "open_clip", "torchvision", "edgecap.models", "edgecap.train", "edgecap.export",
                            "edgecap.runtime", "edgecap.data", "edgecap.metrics", "edgecap.retrieval"),
    "edgecap/contract": ("torch", "open_clip", "torchvision", "edgecap.models", "edgecap.train", "edgecap.export",
                         "edgecap.runtime", "edgecap.data", "edgecap.metrics", "edgecap.retrieval"),
    # a fleet's logs on Ray: above the runtime, and as torch-free as it (its actors run bundles)
    "edgecap/fleet": ("torch", "open_clip", "torchvision", "edgecap.models", "edgecap.train", "edgecap.export"),
}


def _imported_modules(path):
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                yield f"{base}.{node.module}" if node.module else base
            else:
                yield node.module


REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_import_anywhere_in_the_robot_side_reaches_the_torch_side(folder):
    bad = []
    where = REPO / folder
    for path in [where] if where.is_file() else sorted(where.rglob("*.py")):
        for name in _imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[folder]):
                bad.append(f"{path.relative_to(REPO)} imports {name}")
    assert bad == []


def _required_modules(path):
    """The modules a file imports through edgecap.errors.require("name", ...) (optional extras)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "require" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node.args[0].value


def test_only_the_fleet_package_imports_ray_and_nothing_imports_the_fleet():
    """Ray is edgecap[fleet]'s alone: the runtime, the robot kit and every other package run without
    it (the CLI names the fleet command by its module's name, not by an import)."""
    def banned(name):
        return name.split(".")[0] == "ray" or name == "edgecap.fleet" or name.startswith("edgecap.fleet.")

    bad = []
    for path in sorted([*(REPO / "edgecap").rglob("*.py"), *(REPO / "robot").rglob("*.py")]):
        if (REPO / "edgecap" / "fleet") in path.parents:
            continue
        bad += [f"{path.relative_to(REPO)} imports {name}"
                for name in [*_imported_modules(path), *_required_modules(path)] if banned(name)]
    assert bad == []
    fleet = {n for p in (REPO / "edgecap" / "fleet").rglob("*.py") for n in [*_imported_modules(p), *_required_modules(p)]}
    assert "ray" in fleet  # the rule above guards something


def test_ray_is_in_the_fleet_extra_only_and_make_test_installs_it():
    """The robot install (`pip install edgecap`) does not grow; `make test` runs the fleet tests."""
    import re

    from edgecap.jsonio import read_toml

    project = read_toml(REPO / "pyproject.toml")["project"]
    assert not [d for d in project["dependencies"] if d.startswith("ray")]
    extras = project["optional-dependencies"]
    assert [name for name, deps in extras.items() if any(d.startswith("ray") for d in deps)] == ["fleet"]
    install = re.search(r'-e "\.\[([a-z0-9,-]+)\]"', (REPO / "Makefile").read_text())
    assert "fleet" in install.group(1).split(",")


# -- import cycles, imports inside functions included -----------------------------------------
def _module_name(path):
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """edgecap module -> the edgecap modules it imports anywhere in its file. `from a import b`
    is an edge to a.b when that is a module, else to a; parent packages are not edges of their
    own (importing a.b runs a/__init__.py, which a cycle through it would show as a -> ...)."""
    import ast

    paths = {_module_name(p): p for p in (REPO / "edgecap").rglob("*.py")}

    def resolve(name):
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[module] = {t for t in map(resolve, targets) if t and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _top_package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_the_cycle_finder_finds_a_cycle_through_an_import_inside_a_function():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_import_cycle_even_through_imports_inside_functions():
    assert _cycles(_import_graph()) == []


def test_no_package_import_cycle():
    """Between edgecap's subpackages too: the runtime scores with edgecap.metrics, so nothing in
    metrics may reach back into the runtime (what both need lives in edgecap.contract)."""
    graph = _import_graph()
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(_top_package(module), set()).update(
            _top_package(t) for t in targets if _top_package(t) != _top_package(module))
    assert _cycles(packages) == []
