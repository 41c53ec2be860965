"""`edgecap` command line: a table of lazily imported subcommands.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int` and imports
its heavy libraries inside `run`, so `edgecap --help` and the robot-side commands never
load torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys

from edgecap import __version__
from edgecap.argtypes import Parser
from edgecap.errors import EdgecapError, did_you_mean
from edgecap.io import Terminated, terminate_as_interrupt

# name -> (module, one-line help). Add a command by adding a line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("edgecap.models.command", "list model families, presets and parameter counts"),
    "caption": ("edgecap.train.caption_command", "caption images with a checkpoint (PyTorch)"),
    "data": ("edgecap.data.command", "generate the synthetic tabletop world"),
    "export": ("edgecap.export.command", "export a checkpoint to a static ONNX / TensorRT bundle (parity-checked)"),
    "train": ("edgecap.train.command", "train a captioner from a TOML config: XE then SCST, resumable, DDP under torchrun"),
    "eval": ("edgecap.metrics.command", "evaluate captions: ACVR object coverage, COCO metrics, CHAIR"),
    "run": ("edgecap.runtime.command", "caption a camera, stream, video, folder or synth:// with a bundle (no torch)"),
    "demo": ("edgecap.export.demo_command", "export the demo model and caption the synthetic world live"),
    "features": ("edgecap.data.features_command", "precompute a front end's grid features into HDF5 (M2 layout)"),
    "import-m2": ("edgecap.models.import_m2_command", "convert an official M2 Transformer checkpoint to edgecap"),
    "index": ("edgecap.retrieval.command", "build the RA-Transformer caption retrieval index (FAISS)"),
    "ros2": ("edgecap.ros2.command", "caption a ROS 2 camera topic live: captions, coverage, /diagnostics (rclpy)"),
    "fleet": ("edgecap.fleet.command", "caption a fleet's robot logs on a Ray cluster: caption logs, one Parquet dataset, resumable"),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgecap",
        description="Image captioning for robots: train, export, run, evaluate.",
        epilog="commands:\n" + "\n".join(f"  {n:<10} {h}" for n, (_, h) in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"edgecap {__version__}")
    parser.add_argument("command", nargs="?", help="one of: " + ", ".join(COMMANDS))
    return parser


def describe_actions(parser: argparse.ArgumentParser) -> None:
    """`edgecap eval coco --help` opens with the line `edgecap eval --help` lists it with."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                sub.description = sub.description or choice.help
                describe_actions(sub)


def _stdout_closed() -> bool:
    """True when standard output is a pipe whose reader has gone (`edgecap ... | head`)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    if not hasattr(select, "poll"):  # Windows: a broken pipe there is stdout's in practice
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _discard_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def command_parser(name: str) -> Parser:
    """The parser of `edgecap NAME` (importing the command's module, not its heavy libraries)."""
    module_name, help_text = COMMANDS[name]
    parser = Parser(prog=f"edgecap {name}", description=help_text)
    importlib.import_module(module_name).add_arguments(parser)
    describe_actions(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv and argv[0] in COMMANDS else ""
    try:
        # SIGTERM (service managers, CI, `kill`) unwinds like Ctrl-C: temporaries are removed.
        # From the first step, so a signal while a command's modules load ends the same way.
        with terminate_as_interrupt():
            code = _dispatch(argv)
            sys.stdout.flush()  # a pipe closed early fails here, not at interpreter exit
            return code
    except EdgecapError as exc:
        print(f"edgecap {name}: error: {exc}", file=sys.stderr)
        return 1
    except MemoryError as exc:  # a size no option bound caught: one line, not a traceback
        print(f"edgecap {name}: error: out of memory{f' ({exc})' if str(exc) else ''}; ask for fewer or "
              f"smaller items (a count, size, batch or beam option)", file=sys.stderr)
        return 1
    except Terminated as exc:
        print(f"{_prog(name)}: terminated ({exc})", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print(f"{_prog(name)}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `edgecap run ... | head`: the reader left, so stop as a Unix tool does on SIGPIPE,
        # unwinding like Ctrl-C (files closed, temporaries removed), without a traceback.
        if not _stdout_closed():
            raise
        _discard_stdout()
        print(f"edgecap {name}: stopped: standard output was closed (the program reading it "
              "exited)", file=sys.stderr)
        return 128 + 13  # as a process killed by SIGPIPE


def _prog(name: str) -> str:
    return f"edgecap {name}" if name else "edgecap"


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        args = _top_parser().parse_args(argv)
        _top_parser().print_help()
        return 0 if args.command is None and not argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"edgecap: unknown command {name!r}{did_you_mean(name, COMMANDS)}; "
              f"commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        args = command_parser(name).parse_args(rest)
    except SystemExit as exc:  # --help (0), or a bad flag (2) whose one line the parser printed
        return int(exc.code or 0)
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
