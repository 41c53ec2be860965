"""The deployment kit and the docs agree with the code: every option the sample runtime config
shows (commented-out ones included), every parameter and edgecap name the ROS 2 node and its
docs use, the service's writable paths, and every `edgecap ...` command the docs show."""

import argparse
import ast
import importlib
import inspect
import re
import shlex
import sys
from pathlib import Path

import pytest

from edgecap.cli import COMMANDS
from edgecap.runtime.command import CONFIG_PATHS, add_arguments, settings_from_args

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
ROBOT = REPO / "robot"
NODE = REPO / "edgecap" / "ros2" / "node.py"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), ROBOT / "README.md",
        REPO / "export" / "README.md", REPO / "benchmarks" / "README.md"]


def _run_args(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


# -- robot/edgecap-runtime.toml ----------------------------------------------------------------
def _commented_options() -> list[str]:
    """`# key = value` lines: the options the sample shows but leaves off."""
    text = (ROBOT / "edgecap-runtime.toml").read_text()
    return [m.group(1) for m in re.finditer(r"^# ?([a-z_]+ = \S.*)$", text, re.M)]


def test_the_sample_config_shows_the_optional_settings():
    keys = {line.split(" = ")[0] for line in _commented_options()}
    assert {"area", "spin", "providers", "detections", "save_video", "topic", "replay", "out_mcap",
            "rerun"} <= keys


@pytest.mark.parametrize("line", _commented_options())
def test_each_commented_option_of_the_sample_config_works_when_uncommented(tmp_path, line):
    """Uncommenting a line is what the file invites: the key must exist, have the right type
    and pass the same checks as its flag."""
    config = tmp_path / "edgecap-runtime.toml"
    config.write_text('bundle = "/opt/edgecap/bundle"\n' + (line if line.startswith("source") else
                                                            f'source = "0"\n{line}') + "\n")
    key, value = line.split(" = ", 1)
    value = tomllib.loads(f"v = {value.split('  #')[0]}")["v"]
    settings = settings_from_args(_run_args("--config", str(config)))
    got = getattr(settings, key)
    if key in CONFIG_PATHS:
        assert got == str(Path(value).resolve())
    elif key == "replay":
        assert settings.pace == {"fast": "every", "realtime": "native"}[value]
    else:
        assert got == value


def test_the_service_writes_only_under_its_state_directory():
    """User=edgecap may write only to StateDirectory (/var/lib/edgecap); every output the sample
    config names, used or commented out, must lie there."""
    unit = (ROBOT / "edgecap.service").read_text()
    fields = dict(line.split("=", 1) for line in unit.splitlines() if re.match(r"^[A-Za-z]+=", line))
    state = Path("/var/lib") / fields["StateDirectory"]
    assert Path(fields["WorkingDirectory"]) == state
    text = (ROBOT / "edgecap-runtime.toml").read_text()
    outputs = {"jsonl", "save_video", "out_mcap", "rerun"}
    named = {m.group(1): m.group(2) for m in re.finditer(r'^#? ?([a-z_]+) = "([^"]+)"', text, re.M)}
    assert outputs <= set(named)
    for key in outputs:
        assert Path(named[key]).parent == state, (key, named[key])
    # and the unit's own command line is one `edgecap run` accepts, reading this config
    argv = shlex.split(fields["ExecStart"])
    assert argv[0] == "/opt/edgecap/venv/bin/edgecap" and argv[1] == "run"
    assert argv[argv.index("--config") + 1] == "/etc/edgecap/edgecap-runtime.toml"
    _run_args(*argv[2:])


@pytest.mark.parametrize("unit", [ROBOT / "edgecap.service", NODE.parent / "share" / "edgecap-ros2.service"],
                         ids=["run", "ros2"])
def test_each_shipped_unit_runs_with_two_malloc_arenas(unit):
    """The soak's allocator finding (benchmarks/README.md, "Soak") reaches the robot only if
    the units a user installs carry it: glibc's one-arena-per-thread default holds twice the
    resident growth of a weeks-long run."""
    env = [line.split("=", 1)[1] for line in unit.read_text().splitlines() if line.startswith("Environment=")]
    assert "MALLOC_ARENA_MAX=2" in env, (unit.name, env)


def test_the_robot_readme_installs_what_the_unit_runs():
    readme = (ROBOT / "README.md").read_text()
    unit = (ROBOT / "edgecap.service").read_text()
    assert "python3 -m venv /opt/edgecap/venv" in readme and "/opt/edgecap/venv/bin/edgecap run" in unit
    assert "/etc/edgecap/edgecap-runtime.toml" in readme and "/etc/systemd/system/edgecap.service" in readme
    assert re.search(r"useradd .*--groups video edgecap", readme) and "User=edgecap" in unit


# -- the ROS 2 node (edgecap/ros2) -------------------------------------------------------------
def _node_tree() -> ast.Module:
    return ast.parse(NODE.read_text())


def _ros_value(text: str):
    """A `-p name:=value` value as rclpy types it (YAML): bool, int, float or string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def test_every_ros_parameter_the_docs_pass_is_declared_and_valid():
    from edgecap.ros2.params import BY_NAME

    passed = []
    for path in (ROBOT / "README.md", REPO / "docs" / "runtime.md", NODE, *NODE.parent.glob("share/*")):
        passed += re.findall(r"-p (\w+):=([^\s`'\"]+)", path.read_text())
    assert passed, "the docs show no -p parameters"
    for name, value in passed:
        assert name in BY_NAME, f"-p {name}: the node declares only {sorted(BY_NAME)}"
        if not value.isupper():  # placeholders: -p bundle:=DIR
            BY_NAME[name].check(_ros_value(value))


def test_the_node_uses_only_edgecap_names_that_exist_with_the_keywords_they_take():
    tree = _node_tree()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("edgecap"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module}.{alias.name}"
    from edgecap.runtime.captioner import Captioner

    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "from_bundle"]
    assert calls
    accepted = inspect.signature(Captioner.from_bundle).parameters
    for call in calls:
        for kw in call.keywords:
            assert kw.arg in accepted, f"Captioner.from_bundle has no {kw.arg}="


# -- every edgecap command the docs show -------------------------------------------------------
def _doc_commands():
    """(file, command, whole): commands in fenced blocks (whole commands) and inline spans."""
    for path in DOCS:
        text = path.read_text()
        for block in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
            for line in block.group(1).replace("\\\n", " ").splitlines():
                line = line.strip().removeprefix("$ ")
                for part in re.split(r"\s*(?:&&|;|&)\s+", line):
                    # "edgecap fleet: 3 logs, ..." is a command's output, not a command
                    if re.match(r"^(\S*/)?edgecap [a-z][\w-]*(\s|$)", part) and ": error:" not in part:
                        yield path.name, part, True
        for span in re.finditer(r"`((?:\S*/)?edgecap [a-z][^`]*)`", text):
            yield path.name, span.group(1), False


def _parser(words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    module = importlib.import_module(COMMANDS[words[1]][0])
    parser = argparse.ArgumentParser(prog=f"edgecap {words[1]}", exit_on_error=False)
    module.add_arguments(parser)
    rest = words[2:]
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not (subs and rest and rest[0] in subs[0].choices):
            return parser, rest
        parser, rest = subs[0].choices[rest[0]], rest[1:]


def test_every_edgecap_command_in_the_docs_exists_and_parses(capsys):
    """A reader copies these: a renamed flag or command must not leave the docs behind."""
    problems, seen = [], 0
    for name, command, whole in _doc_commands():
        words = shlex.split(command, comments=True)
        if words[1] in ("COMMAND", "NAME"):  # placeholders: `edgecap COMMAND --help`
            continue
        if words[1] not in COMMANDS:
            problems.append(f"{name}: {command}: no command {words[1]!r}")
            continue
        seen += 1
        parser, rest = _parser(words)
        ours = rest[:rest.index("--ros-args") + 1] if "--ros-args" in rest else rest  # the rest is rclpy's
        for flag in (f for w in ours for f in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", w)):
            if flag not in parser._option_string_actions:
                problems.append(f"{name}: {command}: no option {flag}")
        synopsis = any(w.startswith("[") or "|" in w or w.endswith("...") for w in words)
        if whole and not synopsis:
            try:
                parser.parse_args(rest)
            except (argparse.ArgumentError, SystemExit) as exc:
                problems.append(f"{name}: {command}: {exc} {capsys.readouterr().err.strip()}")
    assert seen > 50 and problems == []
