"""`edgecap ros2 [BUNDLE] [--ros-args ...]`: the ROS 2 captioning node (edgecap.ros2.node).

Everything after --ros-args goes to rclpy as it is, so the node takes ROS arguments as any ROS 2
node does: `--ros-args -r __ns:=/front -r image_raw:=/camera/image_raw -p max_rate:=5
--params-file edgecap-ros2.yaml`. `--share` prints the folder holding the node's systemd unit
and parameters file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SHARE = Path(__file__).resolve().parent / "share"


def add_arguments(parser) -> None:
    parser.add_argument("bundle", nargs="?", help="bundle directory (edgecap export --out); "
                        "overrides the bundle parameter")
    parser.add_argument("--share", action="store_true", help="print the folder of the node's "
                        "systemd unit (edgecap-ros2.service) and parameters file (edgecap-ros2.yaml)")
    parser.add_argument("--ros-args", dest="ros_args", nargs=argparse.REMAINDER, default=[],
                        metavar="ARG", help="ROS arguments, to the end of the line: remappings "
                        "(-r), parameters (-p, --params-file), --log-level; docs/runtime.md")


def run(args) -> int:
    if args.share:
        print(SHARE)
        return 0
    from .node import run_node

    return run_node(["edgecap-ros2", "--ros-args", *args.ros_args], bundle=args.bundle)
