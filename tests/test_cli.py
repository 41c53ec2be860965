"""The CLI's command table: listing, unknown commands, `edgecap models`, a closed stdout.

A signal at any moment of start-up ends `edgecap` with exit 130 (SIGINT) or 143 (SIGTERM),
one line and no traceback, and leaves no half-written file: from the moment edgecap's own code
runs (the interpreter's start-up before it is Python's). Real processes, signalled after a
range of delays counted from when edgecap/__main__.py has taken over the signals.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


# -- a signal at any moment of start-up ------------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]


def _catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (Linux: SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def _signal_at(argv, sig, delay, cwd) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "edgecap", *map(str, argv)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and not _catches(proc.pid, signal.SIGTERM):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        time.sleep(delay)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, err


needs_proc = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")


@needs_proc
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("delay", [0.0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4])
def test_a_signal_while_edgecap_loads_is_one_line(tmp_path, sig, delay):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "out"
    code, err = _signal_at(["data", "synth", "--out", out, "--images", 3000, "--size", 48, "--quiet"],
                           sig, delay, tmp_path)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    if code == 0:  # the machine was fast: it finished before the signal (nothing to check)
        return
    ended = "interrupted" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert (code, len(lines)) == (128 + sig, 1), err
    assert lines[0] in (f"edgecap: {ended}", f"edgecap data: {ended}")
    assert list(tmp_path.iterdir()) == []  # nothing half-written, no work directory


def test_sigterm_inside_onnxruntimes_import_is_a_termination_not_an_import_error(tmp_path):
    """onnxruntime reports an exception raised while its C extension loads as an ImportError;
    a SIGTERM that arrives right then is a termination (143, one line), not an ImportError or
    a "not installed" message. The import is made to receive the signal at that instant."""
    pytest.importorskip("onnxruntime")
    script = tmp_path / "probe.py"
    script.write_text(
        "import os, signal, sys\n"
        "import onnxruntime.capi  # the package, not the extension\n"
        "class SignalInsideTheExtension:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'onnxruntime.capi._pybind_state':\n"
        "            sys.meta_path.remove(self)\n"
        "            try:\n"
        "                os.kill(os.getpid(), signal.SIGTERM)\n"
        "            except BaseException as exc:  # as the extension's loader does\n"
        "                raise ImportError('initialization failed') from exc\n"
        "        return None\n"
        "sys.modules.pop('onnxruntime', None)\n"
        "for name in [m for m in sys.modules if m.startswith('onnxruntime.')]:\n"
        "    sys.modules.pop(name)\n"
        "sys.meta_path.insert(0, SignalInsideTheExtension())\n"
        "from edgecap.__main__ import main\n"
        "sys.argv = ['edgecap', 'run', sys.argv[1], '--source', 'synth://tabletop', '--frames', '1']\n"
        "sys.exit(main())\n")
    pytest.importorskip("torch")
    from tests._export_util import export, save_tiny

    bundle = tmp_path / "bundle"
    export(save_tiny(tmp_path / "tiny.pt", "smart"), bundle)
    out = subprocess.run([sys.executable, str(script), str(bundle)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    assert (out.returncode, out.stderr.strip().splitlines()) == (143, ["edgecap run: terminated (SIGTERM)"])
