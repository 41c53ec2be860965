"""`python -m edgecap.ros2 --ros-args -p bundle:=DIR ...`: the node, ROS arguments passed through."""

import sys

from edgecap.ros2.node import main

if __name__ == "__main__":
    sys.exit(main())
