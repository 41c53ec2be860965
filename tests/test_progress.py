"""One rule for progress bars (edgecap.progress): drawn on a terminal, never into a pipe or a
log file, and --quiet turns them off on a terminal too."""

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

from edgecap.progress import bar_wanted

SYNTH = ["data", "synth", "--images", "6", "--size", "32", "--sequences", "1",
         "--frames-per-sequence", "2", "--video-frames", "0"]


def _synth(out, stderr, *extra):
    return subprocess.run([sys.executable, "-m", "edgecap", *SYNTH, "--out", str(out), *extra],
                          stdout=subprocess.PIPE, stderr=stderr, timeout=300)


def _synth_on_a_terminal(out, *extra) -> str:
    """stderr of `edgecap data synth` run with a pseudo-terminal as its stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    try:
        done = _synth(out, slave, *extra)
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert done.returncode == 0, done.stdout
    return b"".join(chunks).decode(errors="replace")


def test_no_bar_when_stderr_is_a_pipe(tmp_path):
    done = _synth(tmp_path / "world", subprocess.PIPE)
    assert done.returncode == 0, done.stderr
    assert b"wrote 6 images" in done.stdout
    assert b"synth" not in done.stderr and b"img/s" not in done.stderr and b"\r" not in done.stderr


def test_bar_on_a_terminal_unless_quiet(tmp_path):
    assert "synth: 100%" in _synth_on_a_terminal(tmp_path / "a")
    assert "synth" not in _synth_on_a_terminal(tmp_path / "b", "--quiet")


def test_the_rule(tmp_path):
    class Terminal:
        def isatty(self):
            return True

    with open(tmp_path / "log", "w") as log:
        assert not bar_wanted(stream=log)
    assert bar_wanted(stream=Terminal()) and not bar_wanted(quiet=True, stream=Terminal())
    closed = open(tmp_path / "log")
    closed.close()
    assert not bar_wanted(stream=closed)


def test_export_draws_no_bar_into_a_pipe_even_when_asked(tmp_path, capsys):
    # a library caller's export_bundle(progress=True) with stderr redirected (a CI log)
    import torch

    from edgecap.export.bundle import export_bundle
    from edgecap.export.formats import resolve_settings
    from tests._export_util import save_tiny

    ckpt = save_tiny(tmp_path / "tiny.pt", "smart")
    torch.set_num_threads(1)
    settings = resolve_settings({"engine": "onnx", "batch": 1, "beam": 1, "samples": 1, "out": str(tmp_path / "bundle")})
    export_bundle(ckpt, settings, progress=True)
    assert (tmp_path / "bundle" / "manifest.json").exists()
    err = capsys.readouterr().err
    assert "export:" not in err and "step/s" not in err and "\r" not in err
