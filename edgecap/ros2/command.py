"""`edgecap ros2 [BUNDLE] [--lifecycle] [--ros-args ...]`: the ROS 2 captioning node
(edgecap.ros2.node), also `python -m edgecap.ros2 ...` with the same arguments.

Everything after --ros-args goes to rclpy as it is, so the node takes ROS arguments as any ROS 2
node does: `--ros-args -r __ns:=/front -r image_raw:=/camera/image_raw -p max_rate:=5
--params-file edgecap-ros2.yaml`. `--lifecycle` starts the managed (lifecycle) node instead.
`--share` prints the folder holding the node's systemd unit, parameters file and launch file.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from edgecap.__main__ import exit_now
from edgecap.argtypes import Parser
from edgecap.errors import EdgecapError, MissingExtraError

SHARE = Path(__file__).resolve().parent / "share"
ROS_HINT = "or source a ROS 2 install: source /opt/ros/$ROS_DISTRO/setup.bash"


def add_arguments(parser) -> None:
    parser.add_argument("bundle", nargs="?", help="bundle directory (edgecap export --out); "
                        "overrides the bundle parameter")
    parser.add_argument("--lifecycle", action="store_true", help="a managed (lifecycle) node: "
                        "configure loads the bundle, activate captions, deactivate pauses")
    parser.add_argument("--share", action="store_true", help="print the folder of the node's "
                        "systemd unit (edgecap-ros2.service), parameters file (edgecap-ros2.yaml) "
                        "and launch file (edgecap_ros2.launch.py)")
    parser.add_argument("--ros-args", dest="ros_args", nargs=argparse.REMAINDER, default=[],
                        metavar="ARG", help="ROS arguments, to the end of the line: remappings "
                        "(-r), parameters (-p, --params-file), --log-level; docs/runtime.md")


def load_node_module():
    """edgecap.ros2.node, once rclpy and the message packages import: a missing one is named
    with the extra to install; a broken install (a library that does not load) says so."""
    try:
        return importlib.import_module("edgecap.ros2.node")
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing and not missing.startswith("edgecap"):
            raise MissingExtraError(missing, "ros2", ROS_HINT) from None
        raise
    except ImportError as exc:  # installed, but a shared library or symbol is missing
        raise EdgecapError(f"ROS 2 Python is installed but does not load ({exc}); a ROS 2 install sourced "
                           "beside the ros2 extra's wheels, or wheels of two distros, mix libraries: use one") from None


def run(args) -> int:
    if args.share:
        print(SHARE)
        return 0
    node = load_node_module()
    code = node.run_node(["edgecap-ros2", "--ros-args", *args.ros_args], bundle=args.bundle,
                         lifecycle=args.lifecycle)
    # The summary is out and rclpy is shut down: the process ends here, without the interpreter's
    # teardown (finalizing spaCy, onnxruntime and rclpy took 0.7-4 s of a 4.7 s stop)
    exit_now(code)
    return code


def main(argv: list[str] | None = None) -> int:
    """`python -m edgecap.ros2 [BUNDLE] [--lifecycle] --ros-args ...`: the command's own arguments."""
    parser = Parser(prog="edgecap ros2")
    add_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except EdgecapError as exc:
        print(f"edgecap ros2: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        print("edgecap ros2: interrupted", file=sys.stderr)
        return 130
