"""ROS 2 messages and robot logs without ROS: image conversion, caption messages, rosbag2 /
MCAP reading and MCAP writing.

`images` and `captions` need only numpy and OpenCV: the ROS 2 node in robot/ runs them as the
log source and the caption sink do. `logs` (rosbags, mcap, mcap-ros2-support) and `mcap_out`
import their libraries when used; without them a one-line message names `edgecap[ros]`.
"""
