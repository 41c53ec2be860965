#!/usr/bin/env python3
"""A thin alias of `edgecap ros2` for robots whose scripts start a file from a checkout (the node
ships with the package: `edgecap ros2 BUNDLE`, `python -m edgecap.ros2`); same arguments.

    python3 robot/ros2_caption_node.py /opt/edgecap/bundle --ros-args -p max_rate:=5
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without pip install
    from edgecap.ros2.command import main

    sys.exit(main())
