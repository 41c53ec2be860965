"""`python -m edgecap.ros2 [BUNDLE] [--lifecycle] --ros-args ...`: `edgecap ros2`, by module."""

import sys

from edgecap.ros2.command import main

if __name__ == "__main__":
    sys.exit(main())
