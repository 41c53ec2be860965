"""A viewer of the annotated image in the node's own process (issue 42: "a same-process subscriber
to the annotated image made caption and record messages stall for 6 s, then burst"), and
where such a stall comes from.

    python benchmarks/node_viewer.py --seconds 40

This process runs the node (`edgecap.ros2.node.CaptionNode`) and a viewer node in one
MultiThreadedExecutor, as a composed launch would; the viewer subscribes to the node's
`edgecap/annotated`, `edgecap/caption` and `edgecap/record` and spends `--work` s on every
annotated image (a viewer that draws or encodes it). A camera (raw 640x480 at 10 Hz) and a
listener of the records run in their own processes. Two viewers, one after the other: its three
subscriptions in the node's default callback group (one mutually exclusive group per node, as
rclpy makes them), and the annotated image in a group of its own. For each: the records the
outside listener and the viewer received, and the longest gap between two records at each.
Writes viewer.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import REPO, host_info, write_json

from edgecap.argtypes import COUNT, POSITIVE, Integer, Parser

VIEWERS = ("one group", "own group")


def parse_args(argv=None):
    p = Parser(prog="benchmarks/node_viewer.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=POSITIVE, default=40.0, help="camera time per viewer")
    p.add_argument("--work", type=POSITIVE, default=0.5, help="seconds the viewer spends on each image")
    p.add_argument("--width", type=COUNT, default=640)
    p.add_argument("--height", type=COUNT, default=480)
    p.add_argument("--bundle", default=None, help="an exported bundle (default: the demo model's)")
    p.add_argument("--domain", type=Integer(1, 101), default=26, help="ROS_DOMAIN_ID of the runs")
    p.add_argument("--role", choices=("main", "camera", "listener"), default="main", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "node_viewer"))
    return p.parse_args(argv)


def camera(args) -> None:
    """Raw frames on /viewer/image_raw at 10 Hz for --seconds."""
    import rclpy
    from node_soak import frames
    from sensor_msgs.msg import Image

    from edgecap.ros.images import bgr_to_image
    from edgecap.ros2.messages import filled

    rclpy.init()
    node = rclpy.create_node("edgecap_viewer_camera")
    pub = node.create_publisher(Image, "/viewer/image_raw", 10)
    while node.count_subscribers("/viewer/image_raw") == 0:
        time.sleep(0.1)
    shots, start, sent = frames(args, 20), time.monotonic(), 0
    while time.monotonic() < start + args.seconds:
        pub.publish(filled(Image(), bgr_to_image(shots[sent % len(shots)][0], time.time_ns(), "camera", "bgr8")))
        sent += 1
        time.sleep(max(0.0, start + sent / 10.0 - time.monotonic()))


def listener(args) -> None:
    """The monotonic times of /viewer/edgecap/record arrivals, as JSON on stdout."""
    import rclpy
    from std_msgs.msg import String

    rclpy.init()
    node = rclpy.create_node("edgecap_viewer_listener")
    times: list[float] = []
    node.create_subscription(String, "/viewer/edgecap/record", lambda m: times.append(time.monotonic()), 10)
    end = time.monotonic() + args.seconds + 20
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.1)
    print(json.dumps(times), flush=True)


def one_viewer(args, bundle: Path, viewer: str) -> dict:
    import rclpy
    from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
    from rclpy.executors import MultiThreadedExecutor
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    from edgecap.ros2.node import CaptionNode

    context = rclpy.Context()
    rclpy.init(args=["viewer", "--ros-args", "-r", "__ns:=/viewer", "-p", "max_rate:=10.0"], context=context)
    node = CaptionNode(str(bundle), context=context)
    view = rclpy.create_node("edgecap_viewer", context=context)
    seen: dict[str, list[float]] = {"annotated": [], "caption": [], "record": []}

    def on_annotated(msg):
        seen["annotated"].append(time.monotonic())
        time.sleep(args.work)

    group = MutuallyExclusiveCallbackGroup() if viewer == "own group" else None
    view.create_subscription(Image, "/viewer/edgecap/annotated", on_annotated, 10, callback_group=group)
    for kind in ("caption", "record"):
        view.create_subscription(String, f"/viewer/edgecap/{kind}", lambda m, k=kind: seen[k].append(time.monotonic()), 10)
    executor = MultiThreadedExecutor(num_threads=4, context=context)
    for n in (node, view):
        executor.add_node(n)
    me = [sys.executable, __file__, "--seconds", str(args.seconds), "--width", str(args.width),
          "--height", str(args.height)]
    outside = subprocess.Popen([*me, "--role", "listener"], stdout=subprocess.PIPE)
    cam = subprocess.Popen([*me, "--role", "camera"])
    end = time.monotonic() + args.seconds + 15
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.1)
    node.close()
    cam.wait()
    heard = json.loads(outside.communicate()[0])
    executor.shutdown(timeout_sec=1.0)
    context.try_shutdown()

    def longest(times):
        return round(max((b - a for a, b in zip(times[:-1], times[1:], strict=True)), default=0.0), 2)

    return {"viewer": viewer, "published": node.summary.captioned, "outside_records": len(heard),
            "outside_longest_gap_s": longest(heard), "viewer_records": len(seen["record"]),
            "viewer_captions": len(seen["caption"]), "viewer_longest_record_gap_s": longest(seen["record"]),
            "viewer_longest_caption_gap_s": longest(seen["caption"]), "viewer_images": len(seen["annotated"])}


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.update({"ROS_DOMAIN_ID": str(args.domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"})
    if args.role == "camera":
        camera(args)
        return 0
    if args.role == "listener":
        listener(args)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.bundle:
        bundle = Path(args.bundle)
    else:
        from edgecap.export.demo_command import demo_checkpoint, ensure_bundle

        bundle = ensure_bundle(demo_checkpoint(), out / "export", beam=3, log=lambda msg: print(msg, flush=True))
    rows = []
    for viewer in VIEWERS:
        rows.append(one_viewer(args, bundle, viewer))
        print(json.dumps(rows[-1]), flush=True)
    write_json(out / "viewer.json", {"args": vars(args), "host": host_info(), "viewers": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
