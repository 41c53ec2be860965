"""Launch the edgecap captioning node from a ROS 2 install (/opt/ros users):

    ros2 launch "$(edgecap ros2 --share)/edgecap_ros2.launch.py" bundle:=/opt/edgecap/bundle namespace:=/front

Arguments: bundle (the bundle directory), namespace (default /camera), params_file (default:
edgecap-ros2.yaml beside this file) and lifecycle (true: the managed node, which waits for
configure and activate from a lifecycle manager). The node is `edgecap ros2` from the PATH (a
venv made with --system-site-packages after sourcing the install, as docs/runtime.md says);
remap its image topic with the usual launch remappings if the camera is not at image_raw.
"""

from pathlib import Path

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

HERE = Path(__file__).resolve().parent


def generate_launch_description():
    bundle, namespace = LaunchConfiguration("bundle"), LaunchConfiguration("namespace")
    params = [LaunchConfiguration("params_file"), {"bundle": bundle}]
    lifecycle = LaunchConfiguration("lifecycle")
    nodes = [Node(executable="edgecap", arguments=["ros2", *flags], name="edgecap_captioner",
                  namespace=namespace, parameters=params, output="screen", condition=condition)
             for flags, condition in (([], UnlessCondition(lifecycle)), (["--lifecycle"], IfCondition(lifecycle)))]
    return LaunchDescription([
        DeclareLaunchArgument("bundle", description="bundle directory (edgecap export --out)"),
        DeclareLaunchArgument("namespace", default_value="/camera", description="the camera's namespace"),
        DeclareLaunchArgument("params_file", default_value=str(HERE / "edgecap-ros2.yaml"),
                              description="the node's parameters (edgecap-ros2.yaml)"),
        DeclareLaunchArgument("lifecycle", default_value="false", description="true: the managed node"),
        *nodes,
    ])
