"""A signal at any moment of start-up ends `edgecap` with exit 130 (SIGINT) or 143 (SIGTERM),
one line and no traceback, and leaves no half-written file: from the moment edgecap's own code
runs (the interpreter's start-up before it is Python's). Real processes, signalled after a
range of delays counted from when edgecap/__main__.py has taken over the signals."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
