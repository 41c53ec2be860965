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
