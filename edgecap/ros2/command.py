"""`edgecap ros2 BUNDLE [--ros-args ...]`: the ROS 2 captioning node (edgecap.ros2.node).

Everything after BUNDLE goes to rclpy as it is, so the node takes ROS arguments as any ROS 2
node does: `--ros-args -r __ns:=/front -r image_raw:=/camera/image_raw -p max_rate:=5
--params-file robot/edgecap-ros2.yaml`.
"""

from __future__ import annotations

import argparse


def add_arguments(parser) -> None:
    parser.add_argument("bundle", help="bundle directory (edgecap export --out); overrides the "
                        "bundle parameter")
    parser.add_argument("ros_args", nargs=argparse.REMAINDER, metavar="--ros-args ...",
                        help="ROS arguments: remappings (-r), parameters (-p, --params-file), "
                        "log level; parameters are listed in docs/runtime.md")


def run(args) -> int:
    from .node import run_node

    return run_node(["edgecap-ros2", *args.ros_args], bundle=args.bundle)
