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


# -- imports inside functions -----------------------------------------------------------------
# edgecap's own modules and the standard library are imported at the top of a module, where a
# reader sees what it depends on. A function imports only what would load a heavy library into
# a process that may never need it (the runtime without torch; `edgecap --help`, `edgecap run
# --help`, `edgecap ros2 --help` without onnxruntime, cv2 or rclpy): a heavy library itself, or
# an edgecap module whose top-level imports load one (directly or through other edgecap modules,
# package __init__ files included; worked out from the syntax trees below, and checked against
# a real interpreter by test_modules_judged_light_load_no_heavy_library).
#
# Heavy: every library outside the standard library, numpy and tqdm included (measured on
# `edgecap eval --help` on a shared 2-core machine: 77 ms, 190 ms with them pulled in at the top),
# and three standard-library modules that cost as much (median import, fresh interpreter):
SLOW_STDLIB = {
    "importlib.metadata": "about 40 ms (email, zipfile, csv), for a version or an installed file",
    "concurrent.futures": "about 12 ms (threads and processes), for one thread pool",
    "tomllib": "about 7 ms (typing, datetime, re); edgecap.jsonio, which every command loads, reads TOML",
}
# A module that already loads a heavy library other than numpy (torch, cv2, rclpy ...) is itself
# imported lazily, off every start-up path, so its imports inside functions must keep out a
# library it does not load already. numpy is the exception: the torch-free start-up paths load it
# (`edgecap run --help` reads the detector's defaults), and there a lazy import of another numpy
# module keeps the runtime's sessions, engines and manifest out (moved to the top, they added 43
# modules and about 100 ms to `edgecap run --help`, same machine).
#
# Imports inside functions that stay for a reason other than weight, with the reason:
FUNCTION_IMPORTS_ALLOWED = {
    ("edgecap.__main__", "edgecap.cli"): "the start-up signal handlers go in before edgecap loads",
}


def _sources() -> tuple[dict[str, str], set[str]]:
    """edgecap's importable modules (name -> source; a ROS launch file such as x.launch.py is
    no module) and which of them are packages."""
    paths = {_module_name(p): p for p in (REPO / "edgecap").rglob("*.py") if "." not in p.stem}
    return ({m: p.read_text(encoding="utf-8") for m, p in paths.items()},
            {m for m, p in paths.items() if p.name == "__init__.py"})


def _is_heavy(name: str) -> bool:
    top = name.split(".")[0]
    if top in ("edgecap", "__future__"):
        return False
    if top not in sys.stdlib_module_names:
        return True
    return any(name == slow or name.startswith(slow + ".") for slow in SLOW_STDLIB)


def _library(name: str) -> str:
    """The heavy library an import loads: a distribution's top-level package, or the slow
    standard-library module."""
    top = name.split(".")[0]
    return top if top not in sys.stdlib_module_names else next(s for s in SLOW_STDLIB if name.startswith(s))


def _import_statements(module: str, source: str, modules, packages) -> list[tuple[list[str], bool, int]]:
    """(names, at the top, line) per import statement of `module`. Names: `import a.b` gives
    a.b; `from a import b` gives a and a.b (a.b where that is an edgecap module, or any name
    from another package). At the top: run on import, class bodies and try blocks included,
    `if TYPE_CHECKING:` blocks not (they never run)."""
    import ast

    package = module if module in packages else module.rpartition(".")[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", getattr(child.test, "attr", "")) == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.Import):
                found.append(([alias.name for alias in child.names], not in_function, child.lineno))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([child.module] if child.module else []))
                names = [f"{base}.{alias.name}" for alias in child.names]
                if base.split(".")[0] == "edgecap":
                    names = [n for n in names if n in modules]
                found.append(([base, *names], not in_function, child.lineno))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def _owner(name: str, modules) -> str | None:
    """The edgecap module that defines `name` (a module, or a name inside one)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _top_level_libraries(sources: dict[str, str], packages) -> dict[str, frozenset[str]]:
    """edgecap module -> the heavy libraries importing it loads: its own top-level imports, its
    package's __init__, and the same for every edgecap module those import."""
    direct, edges = {}, {}
    for module, source in sources.items():
        libraries, targets = set(), {_owner(module.rpartition(".")[0], sources)}
        for names, at_top, _ in _import_statements(module, source, sources, packages):
            for name in names if at_top else ():
                if name.split(".")[0] == "edgecap":  # a.b.c runs a, a.b and a.b.c
                    parts = name.split(".")
                    targets.update(_owner(".".join(parts[:i]), sources) for i in range(1, len(parts) + 1))
                elif _is_heavy(name):
                    libraries.add(_library(name))
        direct[module], edges[module] = libraries, targets - {None, module}

    loaded = {}
    for module in sources:  # everything it reaches (a package and its modules reach each other)
        reached, todo = {module}, [module]
        while todo:
            for target in edges[todo.pop()] - reached:
                reached.add(target)
                todo.append(target)
        loaded[module] = frozenset().union(*(direct[m] for m in reached))
    return loaded


def _function_import_problems(sources: dict[str, str], packages) -> list[str]:
    """One line per import inside a function that the rule above does not allow."""
    heavy = _top_level_libraries(sources, packages)
    problems = []
    for module, source in sorted(sources.items()):
        mine = heavy[module]
        for names, at_top, line in _import_statements(module, source, sources, packages):
            if at_top or (module, names[0]) in FUNCTION_IMPORTS_ALLOWED:
                continue
            where = f"{module} line {line}: import of {names[0]} inside a function"
            if names[0].split(".")[0] == "edgecap":
                loads = frozenset().union(*(heavy[o] for o in (_owner(n, sources) for n in names) if o))
                if not loads:
                    problems.append(f"{where}: it loads no heavy library; import it at the top")
                elif mine - {"numpy"} and loads <= mine:
                    problems.append(f"{where}: it loads {', '.join(sorted(loads))}, which {module} "
                                    "loads already; import it at the top")
            else:
                loads = {_library(n) for n in names if _is_heavy(n)}
                if not loads:
                    problems.append(f"{where}: not a heavy library; import it at the top")
                elif loads <= mine:
                    problems.append(f"{where}: {module} loads {', '.join(sorted(loads))} at its top already")
    return problems


def test_imports_inside_functions_are_for_heavy_libraries_only():
    assert _function_import_problems(*_sources()) == []


def test_the_function_import_rule_tells_heavy_from_light():
    sources = {
        "edgecap.light": "import json\n",
        "edgecap.heavy": "import numpy\nfrom edgecap import light\n",
        "edgecap.torchy": ("import numpy\nimport torch\n\ndef f():\n    import torch\n    from edgecap import heavy\n"
                           "    import onnx\n"),
        "edgecap.numpyish": "import numpy\n\ndef f():\n    from edgecap.heavy import y\n",
        "edgecap.user": ("def f():\n    import json\n    import onnx\n    from importlib.metadata import version\n"
                         "    from edgecap.light import x\n    from edgecap.heavy import y\n    from edgecap import heavy\n"),
    }
    assert _function_import_problems(sources, {"edgecap"}) == [
        "edgecap.torchy line 5: import of torch inside a function: edgecap.torchy loads torch at its top already",
        "edgecap.torchy line 6: import of edgecap inside a function: it loads numpy, which edgecap.torchy loads "
        "already; import it at the top",
        "edgecap.user line 2: import of json inside a function: not a heavy library; import it at the top",
        "edgecap.user line 5: import of edgecap.light inside a function: it loads no heavy library; import it at the top",
    ]


def test_modules_judged_light_load_no_heavy_library():
    """The syntax-tree reading above, checked against an interpreter: every module it finds
    light, imported together, loads nothing heavy."""
    light = sorted(m for m, libraries in _top_level_libraries(*_sources()).items() if not libraries)
    assert len(light) > 30  # the runtime's command, the contract, the CLI's own modules ...
    code = (
        "import importlib, json, sys\nbefore = set(sys.modules)\n"
        f"for name in {light!r}:\n    importlib.import_module(name)\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted({_library(name) for name in loaded if _is_heavy(name) and not name.startswith("__")}) == []
