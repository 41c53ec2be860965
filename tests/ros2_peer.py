"""The other processes of the live ROS 2 tests (tests/test_ros2_live.py): a camera that publishes
frames of the synthetic world (and their detections), a listener that collects what the node
publishes, and a parameter client. Each prints one JSON object on stdout when done.

    python tests/ros2_peer.py publish --topic /raw/image_raw --encoding rgb8 --count 5
    python tests/ros2_peer.py listen --ns /raw --ns /jpeg --records 10 --seconds 30
    python tests/ros2_peer.py set --node /edgecap_captioner beam=3 max_rate=2.5
    python tests/ros2_peer.py hashes
    python tests/ros2_peer.py qos --topic /cam/image_raw --late /cam/edgecap/caption
    python tests/ros2_peer.py call /cam/edgecap/enable false /cam/edgecap/caption_now
    python tests/ros2_peer.py lifecycle --node /cam/edgecap_captioner configure activate
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import rclpy
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from edgecap.ros.images import bgr_to_compressed, bgr_to_image, time_msg
from edgecap.ros2.messages import filled

BASE_STAMP_NS = 1_700_000_000_000_000_000


def qos(kind: str, depth: int) -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth,
                      reliability=ReliabilityPolicy.RELIABLE if kind == "reliable"
                      else ReliabilityPolicy.BEST_EFFORT)


def frame(index: int, width: int, height: int, seed: int):
    """A synthetic-world frame resized to width x height, and its objects in those pixels."""
    import cv2

    from edgecap.data.synth.world import TabletopWorld

    world = TabletopWorld(seed=seed, size=96)
    image, objects = world.render_frame(index * world.scene_frames)
    sx, sy = width / 96, height / 96
    image = cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)
    scaled = [{"class": o["class"], "box": [o["box"][0] * sx, o["box"][1] * sy,
                                            o["box"][2] * sx, o["box"][3] * sy]} for o in objects]
    return image, scaled


def wait_for_subscribers(node: Node, publisher, count: int, graph_only: bool = False, timeout: float = 120.0) -> None:
    """Until the publisher's DDS writer has matched `count` readers (not only seen them in the
    graph); `graph_only`: until the graph has them (a subscriber of another type never matches)."""
    end = time.monotonic() + timeout
    while (node.count_subscribers(publisher.topic_name) if graph_only else publisher.get_subscription_count()) < count:
        if time.monotonic() > end:
            raise SystemExit(f"ros2_peer: no subscriber on {publisher.topic_name} after {timeout:.0f} s")
        rclpy.spin_once(node, timeout_sec=0.05)
    time.sleep(0.5)  # the reader's side of the match may lag the writer's


def publish(args) -> dict:
    from sensor_msgs.msg import CompressedImage, Image
    from std_msgs.msg import String

    node = Node("ros2_peer_camera")
    compressed = args.encoding in ("jpeg", "png")
    pubs = [node.create_publisher(CompressedImage if compressed else Image, topic,
                                  qos(args.qos, args.depth)) for topic in args.topic]
    det_pub = node.create_publisher(String, args.detections, 10) if args.detections else None
    for pub in pubs:
        wait_for_subscribers(node, pub, args.subscribers, args.graph_only)
    sent = []
    period = 1.0 / args.rate
    start = time.monotonic()
    for i, (k, pub) in ((i, k_pub) for i in range(args.count) for k_pub in enumerate(pubs)):
        index = i + args.first + k * args.count     # each topic its own frames
        image, objects = frame(index, args.width, args.height, args.seed)
        stamp = BASE_STAMP_NS + index * 200_000_000
        if det_pub is not None and i % args.detect_every == 0:
            det_pub.publish(String(data=json.dumps({"stamp": time_msg(stamp + args.detect_offset_ns),
                                                    "objects": objects})))
        if compressed:
            msg = filled(CompressedImage(), bgr_to_compressed(image, stamp, "camera", args.encoding))
        elif args.encoding == "16UC1":
            depth = (image[:, :, 0].astype(np.uint16) * 40)
            msg = filled(Image(), {"header": {"stamp": time_msg(stamp), "frame_id": "camera"},
                                   "height": args.height, "width": args.width, "encoding": "16UC1",
                                   "is_bigendian": 0, "step": args.width * 2, "data": depth.tobytes()})
        else:
            msg = filled(Image(), bgr_to_image(image, stamp, "camera", args.encoding))
        pub.publish(msg)
        sent.append({"topic": args.topic[k], "stamp_ns": stamp,
                     "objects": objects if i % args.detect_every == 0 else None})
        if k == len(pubs) - 1:
            time.sleep(max(0.0, start + (i + 1) * period - time.monotonic()))
    time.sleep(args.linger)
    return {"sent": sent}


def listen(args) -> dict:
    from diagnostic_msgs.msg import DiagnosticArray
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    node = Node("ros2_peer_listener")
    from visualization_msgs.msg import Marker

    got: dict = {"records": {}, "captions": {}, "annotated": {}, "markers": {}, "diagnostics": {},
                 "diagnostics_log": []}
    subs = []
    for ns in args.ns:
        for key in ("records", "captions", "annotated", "markers"):
            got[key][ns] = []
        subs += [node.create_subscription(Marker, f"{ns}/edgecap/caption_marker", lambda m, ns=ns: got["markers"][ns].append(
            {"stamp_ns": m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec,
             "frame_id": m.header.frame_id, "text": m.text, "type": m.type}), 100),
                 node.create_subscription(String, f"{ns}/edgecap/record",
                                          lambda m, ns=ns: got["records"][ns].append(json.loads(m.data)), 100),
                 node.create_subscription(String, f"{ns}/edgecap/caption",
                                          lambda m, ns=ns: got["captions"][ns].append(m.data), 100)]
        node.create_subscription(Image, f"{ns}/edgecap/annotated", lambda m, ns=ns: got["annotated"][ns].append(
            {"stamp_ns": m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec,
             "width": m.width, "height": m.height, "encoding": m.encoding}), 100)

    def on_diagnostics(msg):
        for status in msg.status:
            got["diagnostics"][status.name] = {"level": int.from_bytes(status.level, "little")
                                               if isinstance(status.level, bytes) else int(status.level),
                                               "message": status.message,
                                               "values": {kv.key: kv.value for kv in status.values}}
            got["diagnostics_log"].append({"name": status.name, **got["diagnostics"][status.name]})

    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
    end = time.monotonic() + 120.0
    while any(sub.get_publisher_count() == 0 for sub in subs):   # matched by DDS, not only in the graph
        if time.monotonic() > end:
            raise SystemExit("ros2_peer: the node's publishers never appeared")
        rclpy.spin_once(node, timeout_sec=0.05)
    print("listening", file=sys.stderr, flush=True)
    end, since = time.monotonic() + args.seconds, None
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.05)
        if args.until and since is None and os.path.exists(args.until):
            since = len(got["diagnostics_log"])
        if since is not None and _idle(got, since, args.until_level):
            break
        if args.records and sum(len(v) for v in got["records"].values()) >= args.records and _settled(got):
            end = min(end, time.monotonic() + args.after)
    return got


def _idle(got: dict, since: int, level: int | None) -> bool:
    """In the /diagnostics heard after entry `since`: every node has nothing waiting (each frame
    it received was captioned, dropped, skipped or refused) or is paused, all of them together captioned as
    many frames as records were heard here, and each is at `level` when one is asked for. So
    the test's camera has finished and every caption arrived, however slow the machine."""
    latest = {d["name"]: d for d in got["diagnostics_log"][since:] if d["name"].startswith("edgecap: ")}
    if not latest:
        return False
    captioned = 0
    for status in latest.values():
        count = {k: int(status["values"].get(k, 0)) for k in ("received", "captioned", "dropped", "skipped", "refused")}
        paused = status["values"].get("enabled") == "false"       # what waits is dropped on resuming
        if not paused and count["received"] != sum(count[k] for k in ("captioned", "dropped", "skipped", "refused")):
            return False
        if level is not None and status["level"] != level:
            return False
        captioned += count["captioned"]
    return captioned == sum(len(v) for v in got["records"].values())


def _settled(got: dict) -> bool:
    """Each node's /diagnostics has counted every record heard from it (however slow the machine)."""
    for ns, records in got["records"].items():
        counted = [int(d["values"].get("captioned", 0)) for name, d in got["diagnostics"].items()
                   if name.startswith(f"edgecap: {ns.rstrip('/')}/")]
        if records and not any(n >= len(records) for n in counted):
            return False
    return True


def set_parameters(args) -> dict:
    from rcl_interfaces.srv import SetParameters
    from rclpy.parameter import Parameter

    node = Node("ros2_peer_parameters")
    client = node.create_client(SetParameters, f"{args.node}/set_parameters")
    if not client.wait_for_service(timeout_sec=120.0):
        raise SystemExit(f"ros2_peer: no {args.node}/set_parameters service")
    results = []
    for item in args.assignments:
        name, _, text = item.partition("=")
        value = json.loads(text)
        request = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
        future = client.call_async(request)
        rclpy.spin_until_future_complete(node, future, timeout_sec=120.0)
        result = future.result().results[0]
        results.append({"name": name, "successful": result.successful, "reason": result.reason})
    return {"results": results}


def hashes(args) -> dict:
    """{type: the RIHS01 hash the ROS 2 graph announces for a publisher of it}."""
    import importlib

    node = Node("ros2_peer_hashes")
    out = {}
    for i, typename in enumerate(args.types):
        package, _, name = typename.partition("/msg/")
        cls = getattr(importlib.import_module(f"{package}.msg"), name)
        topic = f"/ros2_peer_hash_{i}"
        node.create_publisher(cls, topic, 1)
        info = node.get_publishers_info_by_topic(topic)
        out[typename] = str(info[0].topic_type_hash)
    return {"hashes": out}


def qos_info(args) -> dict:
    """The reliability of every subscription to --topic, and what a late transient-local
    subscriber to --late receives (the last captions a transient-local publisher kept)."""
    from rclpy.qos import DurabilityPolicy
    from std_msgs.msg import String

    node = Node("ros2_peer_qos")
    end = time.monotonic() + 120.0
    while not node.get_subscriptions_info_by_topic(args.topic) and time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.1)
    subs = [str(i.qos_profile.reliability.name).lower() for i in node.get_subscriptions_info_by_topic(args.topic)]
    late = []
    if args.late:
        profile = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        node.create_subscription(String, args.late, lambda m: late.append(m.data), profile)
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.05)
    return {"subscriptions": subs, "late": late}


def call(args) -> dict:
    """Call services in turn: `SERVICE true|false` a std_srvs/SetBool, `SERVICE` a Trigger."""
    from std_srvs.srv import SetBool, Trigger

    node = Node("ros2_peer_caller")
    results, items = [], list(args.calls)
    while items:
        name = items.pop(0)
        flag = items.pop(0) if items and items[0] in ("true", "false") else None
        kind = SetBool if flag is not None else Trigger
        client = node.create_client(kind, name)
        if not client.wait_for_service(timeout_sec=120.0):
            raise SystemExit(f"ros2_peer: no {name} service")
        request = SetBool.Request(data=flag == "true") if flag is not None else Trigger.Request()
        future = client.call_async(request)
        rclpy.spin_until_future_complete(node, future, timeout_sec=120.0)
        response = future.result()
        results.append({"service": name, "success": response.success, "message": response.message})
    return {"results": results}


def lifecycle(args) -> dict:
    """Lifecycle transitions of --node by label (configure, activate, ...), each followed by its state."""
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState, GetState

    node = Node("ros2_peer_lifecycle")
    change = node.create_client(ChangeState, f"{args.node}/change_state")
    get = node.create_client(GetState, f"{args.node}/get_state")
    for client in (change, get):
        if not client.wait_for_service(timeout_sec=120.0):
            raise SystemExit(f"ros2_peer: no lifecycle services on {args.node}")
    out = []
    for label in args.transitions:
        ids = {"configure": Transition.TRANSITION_CONFIGURE, "activate": Transition.TRANSITION_ACTIVATE,
               "deactivate": Transition.TRANSITION_DEACTIVATE, "cleanup": Transition.TRANSITION_CLEANUP}
        future = change.call_async(ChangeState.Request(transition=Transition(id=ids[label])))
        rclpy.spin_until_future_complete(node, future, timeout_sec=60.0)
        state = get.call_async(GetState.Request())
        rclpy.spin_until_future_complete(node, state, timeout_sec=120.0)
        out.append({"transition": label, "success": future.result().success,
                    "state": state.result().current_state.label})
    return {"transitions": out}


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("publish")
    p.add_argument("--topic", action="append", required=True, help="repeat: each topic gets --count "
                   "frames of its own, published together")
    p.add_argument("--encoding", default="rgb8")
    p.add_argument("--count", type=int, default=3)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--rate", type=float, default=5.0)
    p.add_argument("--width", type=int, default=96)
    p.add_argument("--height", type=int, default=96)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--qos", default="sensor_data")
    p.add_argument("--depth", type=int, default=10)
    p.add_argument("--subscribers", type=int, default=1)
    p.add_argument("--detections", default="")
    p.add_argument("--detect-every", type=int, default=1)
    p.add_argument("--detect-offset-ns", type=int, default=0)
    p.add_argument("--linger", type=float, default=0.5)
    p.add_argument("--graph-only", action="store_true", help="wait for subscribers in the graph, not matched ones")
    p = sub.add_parser("listen")
    p.add_argument("--ns", action="append", default=[])
    p.add_argument("--records", type=int, default=0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--after", type=float, default=1.5, help="keep listening this long after --records")
    p.add_argument("--until", default="", help="once this file exists, stop when every node is idle "
                   "and every caption was heard (_idle)")
    p.add_argument("--until-level", type=int, default=None, help="... and every node's diagnostics at this level")
    p = sub.add_parser("set")
    p.add_argument("--node", required=True)
    p.add_argument("assignments", nargs="+")
    p = sub.add_parser("hashes")
    p.add_argument("types", nargs="+")
    p = sub.add_parser("qos")
    p.add_argument("--topic", required=True)
    p.add_argument("--late", default="")
    p.add_argument("--seconds", type=float, default=3.0)
    p = sub.add_parser("call")
    p.add_argument("calls", nargs="+")
    p = sub.add_parser("lifecycle")
    p.add_argument("--node", required=True)
    p.add_argument("transitions", nargs="+")
    args = parser.parse_args()
    rclpy.init()
    try:
        result = {"publish": publish, "listen": listen, "set": set_parameters, "hashes": hashes, "qos": qos_info,
                  "call": call, "lifecycle": lifecycle}[args.mode](args)
    finally:
        rclpy.try_shutdown()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
