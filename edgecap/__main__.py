"""The `edgecap` command (and `python -m edgecap ...` for a venv whose bin/ is not on PATH).

Its first job is to make a signal that arrives while edgecap is still loading end the way
one that arrives later does: exit 130 (SIGINT) or 128 + N, one line, no traceback. Until
`edgecap.cli.main` installs its own handlers (`edgecap.io.terminate_as_interrupt`, which
replaces these), SIGINT / SIGTERM / SIGHUP interrupt the import; nothing has been written
yet. Only the interpreter's own start-up, before this file runs, is out of edgecap's reach.
This module imports nothing but the standard library's `signal` and `sys`, so that window is
as short as Python allows.
"""

import atexit
import os
import signal
import sys

_ARRIVED: list[int] = []
_NAMES = ("SIGINT", "SIGTERM", "SIGHUP")


def _start_up_handler(signum, _frame):
    _ARRIVED.append(signum)
    raise KeyboardInterrupt


_start_up_handler.edgecap_start_up = True  # terminate_as_interrupt may replace it


def main() -> int:
    saved = {}
    for sig in (getattr(signal, name) for name in _NAMES if hasattr(signal, name)):
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            saved[sig] = signal.signal(sig, _start_up_handler)
    try:
        from edgecap.cli import main as cli_main

        if _ARRIVED:  # raised where an import swallowed it
            raise KeyboardInterrupt
        code = cli_main()
    except BaseException:
        if not _ARRIVED:
            raise
        signum = _ARRIVED[0]
        ended = "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
        print(f"edgecap: {ended}", file=sys.stderr)
        code = 128 + signum
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)
    if code in _SIGNAL_CODES or _interrupted():
        exit_now(code)
    return code


def _interrupted() -> bool:
    """Whether a stop signal reached edgecap's own handlers during the command, even one it
    handled (Ctrl-C, after which `edgecap run` exits 0 with its summary): CPython may have marked
    an interrupt unhandled, and one more signal during the interpreter's teardown, after its
    handlers are reset, would end the process by that signal (-2) though its work is done."""
    io = sys.modules.get("edgecap.io")
    return bool(io is not None and io.SIGNALS_RECEIVED)


_SIGNAL_CODES = {128 + getattr(signal, name) for name in _NAMES if hasattr(signal, name)}


def exit_now(code: int) -> None:
    """End with `code` at once: the exit handlers run and the standard streams are flushed, the
    interpreter's teardown is skipped. After an interrupt that edgecap handled: when the
    KeyboardInterrupt passed through Python code that C code ran with PyRun_String (pybind11
    modules do while they load), CPython has marked it unhandled and would end the process by
    SIGINT at exit (-2, whatever the exit code). After the ROS 2 node's summary: finalizing
    spaCy's, onnxruntime's and rclpy's modules took 0.7-4 s, and a node stops within 0.5 s."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
