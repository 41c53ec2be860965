#!/usr/bin/env python3
"""ROS 2 node: caption the newest camera image with an edgecap bundle.

    source /opt/ros/humble/setup.bash
    python3 robot/ros2_caption_node.py --ros-args -p bundle:=/opt/edgecap/bundle \
        -p image_topic:=/camera/image_raw -p beam:=3 -p max_rate:=5.0
    # a compressed stream: -p image_topic:=/camera/image_raw/compressed -p compressed:=true

Subscribes to `image_topic` (sensor_msgs/Image in any encoding edgecap.ros.images reads, or
sensor_msgs/CompressedImage jpeg / png) with a depth-1 best-effort queue and keeps only the
newest message, like `edgecap run`'s capture thread; a worker thread captions it and publishes
what `edgecap run --out-mcap` writes, from the same code (edgecap.runtime.mcap_sink
.record_messages):

    /edgecap/caption      std_msgs/String                 the caption
    /edgecap/record       std_msgs/String                 JSON record: header stamp, latency, ...
    /edgecap/annotations  foxglove_msgs/ImageAnnotations  only with objects; needs foxglove_msgs

Everything between the rclpy message and the published fields (image conversion, captioning,
the caption messages) is `CaptionRelay`, which tests/test_runtime_ros2.py runs on messages
deserialised from real logs. Only the rclpy plumbing in main() is untested here (no ROS 2 on
the development machines); rclpy is imported only in main(), so the module imports without ROS.
"""

from __future__ import annotations

import importlib
import threading
import time


class NewestSlot:
    """One-slot buffer: put() overwrites (counting the overwritten as dropped), take() waits."""

    def __init__(self):
        self._cond = threading.Condition()
        self._item = None
        self.dropped = 0

    def put(self, item) -> None:
        with self._cond:
            if self._item is not None:
                self.dropped += 1
            self._item = item
            self._cond.notify()

    def take(self, timeout: float):
        with self._cond:
            if not self._cond.wait_for(lambda: self._item is not None, timeout):
                return None
            item, self._item = self._item, None
            return item


class CaptionRelay:
    """One received image message in, the caption messages out (as field dicts).

    `process` returns [(topic, type, fields)], or None for a message that does not decode
    (counted in `skipped`); an encoding the runtime cannot read raises UnsupportedImage.
    """

    def __init__(self, captioner, msgtype: str, source: str, beam: int | None = None):
        self.captioner = captioner
        self.msgtype = msgtype
        self.source = source
        self.beam = beam
        self.count = 0
        self.skipped = 0
        self.last_skip = ""

    def process(self, msg, received: float, received_ns: int):
        from edgecap.ros.images import ImageDecodeError
        from edgecap.runtime.camera import Frame
        from edgecap.runtime.mcap_sink import record_messages
        from edgecap.runtime.records import Record
        from edgecap.runtime.sources import logged_image

        try:
            image, stamp = logged_image(msg, self.msgtype, received_ns)
        except ImageDecodeError as exc:
            self.skipped += 1
            self.last_skip = str(exc)
            return None
        frame = Frame(image, self.count, received, received_ns / 1e9, stamp=stamp,
                      t_taken=time.monotonic())
        self.count += 1
        caption = self.captioner.caption([image], beam=self.beam)[0]
        record = Record(frame, caption, self.source, time.monotonic())
        return record_messages(record)[1]


def ros_class(typename: str):
    """rclpy's generated class for 'pkg/msg/Name'."""
    package, _, name = typename.partition("/msg/")
    return getattr(importlib.import_module(f"{package}.msg"), name)


def main(argv=None) -> None:
    try:
        import rclpy
    except ModuleNotFoundError:  # rclpy comes with a ROS 2 install, never from pip
        raise SystemExit("ros2_caption_node: rclpy is not importable: run the node from a shell where "
                         "ROS 2 is sourced (source /opt/ros/$ROS_DISTRO/setup.bash); robot/README.md") from None
    from rclpy.node import Node
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

    from edgecap.ros.captions import ANNOTATIONS, STRING, to_ros
    from edgecap.ros.images import COMPRESSED, IMAGE
    from edgecap.runtime.captioner import Captioner

    class CaptionNode(Node):
        def __init__(self):
            super().__init__("edgecap_captioner")
            bundle = self.declare_parameter("bundle", "").value
            if not bundle:
                raise SystemExit("edgecap_captioner: set the 'bundle' parameter to a bundle directory")
            beam = int(self.declare_parameter("beam", 0).value) or None
            self.period = 1.0 / max(1e-3, float(self.declare_parameter("max_rate", 5.0).value))
            image_topic = self.declare_parameter("image_topic", "/camera/image_raw").value
            compressed = bool(self.declare_parameter("compressed", False).value)
            threads = int(self.declare_parameter("threads", 0).value)
            spin = bool(self.declare_parameter("spin", True).value)
            msgtype = COMPRESSED if compressed else IMAGE
            captioner = Captioner.from_bundle(bundle, beam=beam, threads=threads, spin=spin)
            self.relay = CaptionRelay(captioner, msgtype,
                                      f"ros2:{image_topic}")
            try:
                ros_class(ANNOTATIONS)
                self.types = (STRING, ANNOTATIONS)
            except ImportError:
                self.types = (STRING,)
                self.get_logger().warn("foxglove_msgs not installed: no /edgecap/annotations "
                                       "(apt install ros-$ROS_DISTRO-foxglove-msgs)")
            self.pubs = {}
            qos = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST,
                             reliability=ReliabilityPolicy.BEST_EFFORT)
            self.slot = NewestSlot()
            self.create_subscription(ros_class(msgtype), image_topic, self.on_image, qos)
            self.stop = threading.Event()
            self.worker = threading.Thread(target=self.work, daemon=True)
            self.worker.start()
            self.get_logger().info(f"captioning {image_topic} ({msgtype}) with {bundle}")

        def on_image(self, msg):
            self.slot.put((msg, time.monotonic(), time.time_ns()))

        def publish(self, topic, typename, fields):
            if typename not in self.types:
                return
            if topic not in self.pubs:
                self.pubs[topic] = self.create_publisher(ros_class(typename), topic, 10)
            self.pubs[topic].publish(to_ros(fields, typename, ros_class))

        def work(self):
            next_take = 0.0
            while not self.stop.is_set():
                if self.stop.wait(max(0.0, next_take - time.monotonic())):
                    break
                item = self.slot.take(timeout=0.5)
                if item is None:
                    continue
                next_take = time.monotonic() + self.period
                try:
                    messages = self.relay.process(*item)
                except Exception as exc:  # an unsupported encoding: say so, keep the node up
                    self.get_logger().error(str(exc), throttle_duration_sec=10.0)
                    continue
                if messages is None:
                    self.get_logger().warn(f"skipped: {self.relay.last_skip}")
                    continue
                for topic, typename, fields in messages:
                    self.publish(topic, typename, fields)

        def destroy_node(self):
            self.stop.set()
            self.worker.join(timeout=5.0)
            return super().destroy_node()

    rclpy.init(args=argv)
    node = CaptionNode()
    try:
        rclpy.spin(node)
    except KeyboardInterrupt:
        pass
    finally:
        node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()


if __name__ == "__main__":
    main()
