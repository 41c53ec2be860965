"""The synthetic world's moving-camera clip as a robot log: an MCAP file in ROS 2 form.

    /camera/image_raw    sensor_msgs/msg/Image (rgb8, as most ROS camera drivers publish)
    /camera/camera_info  sensor_msgs/msg/CameraInfo (pinhole, no distortion)

Frame t is stamped START_NS + t / fps and logged TRANSPORT_NS later, as a recorder receives a
camera's message a little after the driver stamped it; the message index on the topic is the
video frame number, so the ground-truth sidecar `tabletop.jsonl` works with `--detections`.
The renderer's camera is a pinhole with focal length `focal * size` pixels, its principal
point on the image's vertical centre line at the horizon row.
"""

from __future__ import annotations

from pathlib import Path

from edgecap.ros.images import bgr_to_image, header
from edgecap.ros.mcap_out import McapLogWriter

from .world import TabletopWorld

START_NS = 1_700_000_000_000_000_000       # 2023-11-14T22:13:20Z: fixed, so files are reproducible
TRANSPORT_NS = 2_000_000                   # 2 ms from driver stamp to recorder
FRAME_ID = "camera_optical"
IMAGE_TOPIC = "/camera/image_raw"
INFO_TOPIC = "/camera/camera_info"


def camera_info(world: TabletopWorld, t: int, stamp_ns: int) -> dict:
    """sensor_msgs/CameraInfo fields of frame t."""
    cam = world.camera(t)
    size = world.size
    f, cx, cy = cam.focal * size, size / 2.0, cam.horizon * size
    return {"header": header(stamp_ns, FRAME_ID), "height": size, "width": size,
            "distortion_model": "plumb_bob", "d": [0.0] * 5,
            "k": [f, 0.0, cx, 0.0, f, cy, 0.0, 0.0, 1.0],
            "r": [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
            "p": [f, 0.0, cx, 0.0, 0.0, f, cy, 0.0, 0.0, 0.0, 1.0, 0.0],
            "binning_x": 0, "binning_y": 0,
            "roi": {"x_offset": 0, "y_offset": 0, "height": 0, "width": 0, "do_rectify": False}}


class McapClipSink:
    """Writes frames of the clip to `path` as they are rendered (beside the mp4)."""

    def __init__(self, path: Path, world: TabletopWorld):
        self.world = world
        self.writer = McapLogWriter(path, "--mcap", {"generator": "edgecap.data.synth",
                                                     "seed": str(world.seed)})

    def write(self, t: int, image) -> None:
        stamp = START_NS + round(t * 1e9 / self.world.fps)
        log_time = stamp + TRANSPORT_NS
        self.writer.write(IMAGE_TOPIC, "sensor_msgs/msg/Image",
                          bgr_to_image(image, stamp, FRAME_ID, "rgb8"), log_time)
        self.writer.write(INFO_TOPIC, "sensor_msgs/msg/CameraInfo",
                          camera_info(self.world, t, stamp), log_time)

    def close(self) -> None:
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()
