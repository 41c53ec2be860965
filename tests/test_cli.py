"""The CLI's command table: listing, unknown commands, `edgecap models`, a closed stdout."""

import pytest


def test_unknown_command_suggests_the_closest(run_cli):
    code, _, err = run_cli("modles")
    assert code == 2
    assert "did you mean 'models'" in err


def test_models_prints_every_family_with_parameter_counts(run_cli):
    code, out, _ = run_cli("models")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip() and not line.startswith("Parameter")}
    assert {"smart", "smart-nomem", "pma", "pma-edge", "m2", "transformer", "updown"} <= set(rows)
    assert "40 slots" in rows["smart"] and rows["smart"].rstrip().endswith("M")
    assert "meshed" in rows["m2"]


def test_help_lists_commands(run_cli):
    code, out, _ = run_cli()
    assert code == 0
    assert "models" in out and "caption" in out


def _command_parsers():
    """(name, parser) of every command and action, built as `edgecap NAME --help` builds them."""
    import argparse

    from edgecap.cli import COMMANDS, command_parser

    for name in COMMANDS:
        todo = [(f"edgecap {name}", command_parser(name))]
        while todo:
            prog, p = todo.pop()
            yield prog, p
            for action in p._actions:
                if isinstance(action, argparse._SubParsersAction):
                    todo += [(f"{prog} {sub}", sp) for sub, sp in action.choices.items()]


def test_every_option_is_documented_with_its_default():
    """`edgecap X --help` is the reference a user reads first: every command and action says
    what it does, every option has a help line, and an option that has a default names it."""
    import argparse

    missing = []
    for prog, parser in _command_parsers():
        if not parser.description:
            missing.append(f"{prog}: no description")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
                continue
            option = "/".join(action.option_strings) or action.dest
            if not action.help:
                missing.append(f"{prog} {option}: no help")
            elif (action.option_strings and action.nargs != 0 and action.default not in (None, "", [])
                  and "default" not in action.help):
                missing.append(f"{prog} {option}: default {action.default!r} not shown")
    assert missing == []


def test_an_action_help_opens_with_what_it_does(run_cli):
    code, out, _ = run_cli("eval", "coco", "--help")
    assert code == 0
    assert "BLEU-1..4, METEOR, ROUGE-L, CIDEr-D" in out.split("options:")[0]


def test_python_dash_m_edgecap_is_the_edgecap_command(python, tmp_path):
    import subprocess

    done = subprocess.run([python, "-m", "edgecap", "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("edgecap ")
    done = subprocess.run([python, "-m", "edgecap", "modles"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "did you mean 'models'" in done.stderr


def _with_closed_stdout(python, tmp_path, *argv):
    """Run `python -m edgecap ARGV | head -0`: its standard output is a pipe nobody reads."""
    import os
    import subprocess

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([python, "-m", "edgecap", *map(str, argv)], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=300)
    finally:
        os.close(write_end)


def test_a_closed_pipe_stops_the_command_in_one_line(python, tmp_path):
    """`edgecap models | head -1` closes the pipe before Python's last flush: no traceback."""
    done = _with_closed_stdout(python, tmp_path, "models")
    assert done.returncode == 141
    assert done.stderr.strip().splitlines() == [
        "edgecap models: stopped: standard output was closed (the program reading it exited)"]


def test_a_pipe_closed_while_captioning_stops_without_a_traceback(python, tmp_path):
    """`edgecap caption CKPT FOLDER | head -3` used to end in a BrokenPipeError traceback."""
    import cv2
    import numpy as np

    pytest.importorskip("torch")
    from tests._export_util import save_tiny

    ckpt = save_tiny(tmp_path / "cnn.pt", "smart-nomem", n_regions=16,
                     visual={"kind": "cnn", "image_size": 16, "channels": [8, 24]})
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i:06d}.png"), np.full((20, 24, 3), 40 * i, np.uint8))
    done = _with_closed_stdout(python, tmp_path, "caption", ckpt, folder, "--batch", 1)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "edgecap caption: stopped: standard output was closed (the program reading it exited)")
