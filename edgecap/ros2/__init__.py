"""The ROS 2 captioning node (`edgecap ros2 BUNDLE`, `python -m edgecap.ros2`).

Above both edgecap.runtime (the Captioner, coverage, records) and edgecap.ros (message
conversion, shared with the log readers and writers), which is why it is a package of its own.
rclpy and the message packages are imported only when the node starts (`pip install
"edgecap[ros2]"`, or a sourced /opt/ros install); everything else here imports without them.
"""
