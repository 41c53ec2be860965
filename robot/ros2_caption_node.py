#!/usr/bin/env python3
"""The ROS 2 captioning node, started from a checkout: the node itself ships with the package as
`edgecap ros2 BUNDLE` and `python -m edgecap.ros2` (edgecap/ros2/node.py); this launcher passes
its arguments through, for robots whose scripts start this file.

    python3 robot/ros2_caption_node.py --ros-args -p bundle:=/opt/edgecap/bundle -p max_rate:=5
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without pip install
    from edgecap.ros2.node import main

    sys.exit(main())
