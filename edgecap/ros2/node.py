"""The ROS 2 captioning node: camera images in, captions (and coverage, with detections) out.

    edgecap ros2 BUNDLE --ros-args -r __ns:=/front -p max_rate:=5
    python -m edgecap.ros2 --ros-args -p bundle:=BUNDLE -r image_raw:=/camera/image_raw

Topics are relative to the node's namespace (one node per camera, side by side):

    in   image_raw            sensor_msgs/Image (or CompressedImage with compressed:=true)
    in   detections           with detections_topic: std_msgs/String JSON or Detection2DArray
    out  edgecap/caption      std_msgs/String    the caption
    out  edgecap/record       std_msgs/String    the JSON record (stamps, latency, coverage)
    out  edgecap/annotated    sensor_msgs/Image  boxes coloured by mention, caption band (bgr8)
    out  edgecap/annotations  foxglove_msgs/ImageAnnotations, when foxglove_msgs is importable
    out  /diagnostics         diagnostic_msgs/DiagnosticArray (captions/s, drops, latency, bundle)

Parameters are edgecap.ros2.params.PARAMS. Signals are Python's (edgecap.io.stop_on_signals),
not rclpy's: the executor spins in short slices, so SIGINT / SIGTERM end the node within a
fraction of a second, exit 0, with the summary `edgecap run` prints.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field

from edgecap.errors import EdgecapError, MissingExtraError, did_you_mean

from .params import BY_NAME, PARAMS, ParameterError, check_all

SPIN_SLICE_S = 0.1                 # how long one executor wait may block a signal's handling
WATCH_PERIOD_S = 1.0
DETECTIONS_TOPIC_DEPTH = 10
# ROS parameters every node has: not typos of ours
COMMON_PARAMETERS = ("use_sim_time", "start_type_description_service", "qos_overrides")
ANNOTATED_TOPIC = "edgecap/annotated"


def relative(topic: str) -> str:
    """The caption log's absolute topic names (edgecap.ros.captions) under the node's namespace."""
    return topic.lstrip("/")


def filled(msg, fields: dict):
    """`msg` (a generated message object) with `fields` set, nested dicts into nested messages."""
    for name, value in fields.items():
        if isinstance(value, dict):
            filled(getattr(msg, name), value)
        else:
            setattr(msg, name, value)
    return msg


@dataclass
class Camera:
    """One subscribed image topic: its queue, its frame conversion, its output publishers."""

    queue: object
    topic: str = ""
    relay: object = None
    pubs: dict = field(default_factory=dict)
    annotated_pub: object = None
    last_image: float | None = None
    warned: set = field(default_factory=set)      # the once-only warnings given
    gaps: object = None                           # stats.SequenceGaps: frames lost in transport


def import_rclpy():
    try:
        import rclpy
    except ImportError:
        raise MissingExtraError("rclpy", "ros2", "or source a ROS 2 install: source "
                                "/opt/ros/$ROS_DISTRO/setup.bash") from None
    return rclpy


def message_class(typename: str):
    """rclpy's generated class for 'pkg/msg/Name'; ImportError when the package is missing."""
    import importlib

    package, _, name = typename.partition("/msg/")
    return getattr(importlib.import_module(f"{package}.msg"), name)


def caption_node_class():
    """The rclpy Node subclass (defined here so that this module imports without rclpy)."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
    from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
    from rclpy.node import Node
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    from edgecap.ros.captions import ANNOTATIONS, STRING, to_ros
    from edgecap.ros.images import COMPRESSED, IMAGE, bgr_to_image
    from edgecap.runtime.camera import GrabberStats
    from edgecap.runtime.mcap_sink import record_messages
    from edgecap.runtime.records import Summary

    from .detections import StampedObjects, json_objects, vision_objects
    from .frames import FrameQueue, take_batch
    from .relay import CaptionRelay, ImageDecodeError, Refused
    from .stats import CountedWarning, NodeStats, SequenceGaps

    class CaptionNode(Node):
        def __init__(self, bundle: str | None = None, context=None):
            super().__init__("edgecap_captioner", context=context)
            for p in PARAMS:
                self.declare_parameter(p.name, p.default, ParameterDescriptor(
                    description=p.doc, dynamic_typing=True, read_only=not p.live))
            values = {p.name: self.get_parameter(p.name).value for p in PARAMS}
            if bundle is not None:
                values["bundle"] = bundle
            self.settings = check_all(values)
            self._warn_unknown_parameters()
            s = self.settings
            if not s["bundle"]:
                raise ParameterError("parameter bundle: set it to a bundle directory "
                                     "(edgecap ros2 BUNDLE, -p bundle:=DIR or --params-file)")
            from edgecap.runtime.captioner import Captioner

            self.captioner = Captioner.from_bundle(s["bundle"], threads=s["threads"], spin=s["spin"])
            if s["beam"]:
                self._check_beam(s["beam"])
            self.captioner.warm_up()

            self.msgtype = COMPRESSED if s["compressed"] else IMAGE
            topics = [t.strip() for t in s["image_topics"].split(",") if t.strip()] or [s["image_topic"]]
            if len(topics) > 1 and s["detections_topic"]:
                raise ParameterError(f"parameter detections_topic: detections are matched to one image "
                                     f"topic, and image_topics names {len(topics)}; run one node per "
                                     "camera for coverage")
            self.detections = None
            coverage = None
            if s["detections_topic"]:
                coverage = self._subscribe_detections(s["detections_topic"], s["detections_format"])
            self.detector = self._open_detector() if s["detector"] else None
            if self.detector is not None:
                from edgecap.runtime.detector import coverage_vocabulary
                from edgecap.runtime.scoring import CoverageAnnotator

                coverage = CoverageAnnotator(log=self.get_logger().warning, vocabulary=coverage_vocabulary(self.detector))
                coverage.warm_up()
            self.caption_types = {STRING}
            try:
                message_class(ANNOTATIONS)
                self.caption_types.add(ANNOTATIONS)
            except ImportError:
                pass  # foxglove_msgs is not on PyPI; the annotated image carries the same marks
            reliability = (ReliabilityPolicy.RELIABLE if s["qos"] == "reliable"
                           else ReliabilityPolicy.BEST_EFFORT)
            qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=s["qos_depth"],
                             reliability=reliability, durability=DurabilityPolicy.VOLATILE)
            shared = threading.Condition()
            self.cameras: list[Camera] = []
            for topic in topics:
                camera = Camera(FrameQueue(s["qos_depth"], shared), gaps=SequenceGaps())
                # two arguments: rclpy passes each message's info (its publication sequence number)
                sub = self.create_subscription(message_class(self.msgtype), topic,
                                               lambda msg, info, c=camera: self._on_image(c, msg, info), qos)
                camera.topic = sub.topic_name
                # one camera: outputs in the node's namespace; several: each in its camera's
                prefix = "" if len(topics) == 1 else camera.topic.rpartition("/")[0] + "/"
                camera.relay = CaptionRelay(self.captioner, self.msgtype, f"ros2:{camera.topic}",
                                            s["allow_non_colour"], coverage)
                # every publisher exists before the first frame, so subscribers match at once
                camera.pubs = {relative(out): self.create_publisher(
                    message_class(typename), prefix + relative(out), 10)
                    for out, typename in _caption_topics() if typename in self.caption_types}
                camera.annotated_pub = (self.create_publisher(Image, prefix + ANNOTATED_TOPIC, 10)
                                        if s["publish_annotated"] else None)
                self.cameras.append(camera)
            outputs = [c.pubs["edgecap/caption"].topic_name for c in self.cameras]
            if len(set(outputs)) < len(outputs):
                raise ParameterError(f"parameter image_topics: {s['image_topics']!r} puts two cameras' "
                                     "captions on one topic; name topics in different namespaces")
            self.image_topic = ",".join(c.topic for c in self.cameras)
            self.stats = NodeStats(Summary(f"ros2:{self.image_topic}"))
            self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)

            self.skips = CountedWarning("skipped")
            self.refusals = CountedWarning("refused")
            self.started = time.monotonic()
            self.failure: BaseException | None = None
            self.stop = threading.Event()
            self.create_timer(s["diagnostics_period"], self._diagnose)
            self.create_timer(WATCH_PERIOD_S, self._watch)
            self.add_on_set_parameters_callback(self._on_set_parameters)
            self.worker = threading.Thread(target=self._work, name="edgecap-captioner", daemon=True)
            self.worker.start()
            self.get_logger().info(
                f"captioning {self.image_topic} ({self.msgtype}, {s['qos']} depth {s['qos_depth']}) "
                f"with {s['bundle']} at up to {s['max_rate']:g}/s; captions on {', '.join(outputs)}")

        # -- start-up --------------------------------------------------------------------
        def _check_beam(self, beam: int) -> int:
            try:
                return self.captioner.check_beam(beam)
            except EdgecapError as exc:
                raise ParameterError(f"parameter beam: {exc}") from None

        def _warn_unknown_parameters(self) -> None:
            # rclpy keeps the -p / --params-file values for this node there (no public accessor)
            overrides = getattr(self, "_parameter_overrides", {}) or {}
            for name in overrides:
                if name not in BY_NAME and not name.startswith(COMMON_PARAMETERS):
                    self.get_logger().warning(f"parameter {name!r} is not one of this node's; "
                                              f"ignored{did_you_mean(name, BY_NAME)}")

        def _open_detector(self):
            """The `detector` parameter's model, with the captioner's threads and spin."""
            from edgecap.runtime.detector import Detector

            s = self.settings
            if s["detections_topic"]:
                raise ParameterError("parameter detector: detections_topic already gives the frames' objects; "
                                     "set one of them")
            try:
                detector = Detector.load(s["detector"], threads=s["threads"], spin=s["spin"],
                                         min_score=s["detector_min_score"], iou=s["detector_iou"])
            except EdgecapError as exc:
                raise ParameterError(f"parameter detector: {exc}") from None
            detector.warm_up()
            return detector

        def _subscribe_detections(self, topic: str, kind: str):
            from edgecap.runtime.scoring import CoverageAnnotator, bundle_vectors

            if kind == "vision_msgs":
                try:
                    cls = message_class("vision_msgs/msg/Detection2DArray")
                except ImportError:
                    raise EdgecapError("parameter detections_format: vision_msgs is not importable "
                                       "(apt install ros-$ROS_DISTRO-vision-msgs; it is not on PyPI): "
                                       "use detections_format:=json") from None
                parse = vision_objects
            else:
                cls, parse = String, (lambda msg: json_objects(msg.data))
            self.detections = StampedObjects()
            self.detections_warning = CountedWarning("ignored detections in")
            self.create_subscription(cls, topic, lambda msg: self._on_detections(msg, parse),
                                     QoSProfile(history=HistoryPolicy.KEEP_LAST,
                                                depth=DETECTIONS_TOPIC_DEPTH,
                                                reliability=ReliabilityPolicy.BEST_EFFORT))
            coverage = CoverageAnnotator(log=self.get_logger().warning, vectors=bundle_vectors(self.captioner.bundle))
            coverage.warm_up()
            return coverage

        # -- callbacks (executor thread) ---------------------------------------------------
        def _on_image(self, camera, msg, info) -> None:
            gid = info.get("publisher_gid")                # Kilted on; Jazzy's info lacks it
            if isinstance(gid, dict):
                camera.gaps.note(bytes(gid["data"]).hex(), info.get("publication_sequence_number"))
            elif self.count_publishers(camera.topic) <= 1:  # one numbering on the topic
                camera.gaps.note("", info.get("publication_sequence_number"))
            camera.last_image = time.monotonic()
            camera.queue.put((msg, camera.last_image, time.time_ns()))

        def _on_detections(self, msg, parse) -> None:
            try:
                self.detections.add(*parse(msg))
            except EdgecapError as exc:
                self._note(self.detections_warning, str(exc))

        def _on_set_parameters(self, params):
            changes = {}
            for param in params:
                spec = BY_NAME.get(param.name)
                if spec is None:
                    continue
                if not spec.live:
                    return SetParametersResult(successful=False,
                                               reason=f"parameter {param.name} is read only while running")
                try:
                    value = spec.check(param.value)
                    if param.name == "beam" and value:
                        self._check_beam(value)
                except EdgecapError as exc:
                    return SetParametersResult(successful=False, reason=str(exc))
                changes[param.name] = value
            self.settings.update(changes)
            for name, value in changes.items():
                self.get_logger().info(f"{name} is now {value}")
            return SetParametersResult(successful=True)

        def _watch(self) -> None:
            """Until a camera's first image: warn once when its topic's publishers use another
            type (checked every tick, as publishers come and go), and once when none came in time."""
            waited = time.monotonic() - self.started
            for camera in self.cameras:
                if camera.last_image is not None:
                    continue
                types = sorted({i.topic_type for i in self.get_publishers_info_by_topic(camera.topic)})
                if types and self.msgtype not in types and "type" not in camera.warned:
                    camera.warned.add("type")
                    hint = ("compressed:=false" if IMAGE in types else
                            "compressed:=true" if COMPRESSED in types else "image_topic to an image topic")
                    self.get_logger().warning(
                        f"{camera.topic} carries {', '.join(types)}, not {self.msgtype}: no image "
                        f"can arrive; set {hint}")
                if waited >= self.settings["no_image_warning"] and "idle" not in camera.warned:
                    camera.warned.add("idle")
                    self.get_logger().warning(
                        f"no image on {camera.topic} after {waited:.1f} s "
                        f"({self.count_publishers(camera.topic)} publishers)")

        def _diagnose(self) -> None:
            s, stats = self.settings, self.stats
            stats.summary.grabber = GrabberStats.total(c.queue.stats for c in self.cameras)
            stats.lost = sum(c.gaps.lost for c in self.cameras)
            level, message = DiagnosticStatus.OK, "captioning"
            waiting = [c.topic for c in self.cameras if c.last_image is None]
            if waiting:
                level, message = DiagnosticStatus.WARN, f"no image on {', '.join(waiting)} yet"
            elif stats.refused and not stats.summary.captioned:
                level, message = DiagnosticStatus.ERROR, "every frame refused (encoding)"
            extra = {"bundle": str(s["bundle"]),
                     "providers": ",".join(self.captioner.bundle.providers),
                     "beam": str(s["beam"] or self.captioner.beam), "max_rate": f"{s['max_rate']:g}",
                     "image_topic": self.image_topic, "qos": f"{s['qos']} depth {s['qos_depth']}"}
            if self.detections is not None:
                extra.update({f"detections_{k}": str(v) for k, v in self.detections.report().items()})
            if len(self.cameras) > 1:
                extra.update({f"received {c.topic}": str(c.queue.stats.captured) for c in self.cameras})
            status = DiagnosticStatus(level=level, name=f"edgecap: {self.get_fully_qualified_name()}",
                                      message=message, hardware_id=str(s["bundle"]),
                                      values=[KeyValue(key=k, value=v) for k, v in stats.values(extra)])
            array = DiagnosticArray(status=[status])
            array.header.stamp = self.get_clock().now().to_msg()
            self.diagnostics_pub.publish(array)

        # -- the captioning thread --------------------------------------------------------
        def _work(self) -> None:
            last_take = float("-inf")
            try:
                while not self.stop.is_set():
                    # sliced, so a max_rate change (or a stop) applies at once
                    due = last_take + 1.0 / self.settings["max_rate"]
                    if time.monotonic() < due:
                        self.stop.wait(min(SPIN_SLICE_S, due - time.monotonic()))
                        continue
                    batch = take_batch([c.queue for c in self.cameras], SPIN_SLICE_S)
                    if not batch:
                        continue
                    last_take = time.monotonic()
                    self._caption([(self.cameras[i], item) for i, item in batch])
            except Exception as exc:  # an engine failure: end the node with its one line
                self.failure = exc
                self.stop.set()

        def _caption(self, batch) -> None:
            """Caption one frame of each camera in `batch` ([(camera, item)]) together."""
            frames, cameras = [], []
            for camera, (msg, received, received_ns) in batch:
                try:
                    frame = camera.relay.frame(msg, received, received_ns)
                except ImageDecodeError as exc:
                    camera.queue.stats.skipped += 1
                    self._note(self.skips, str(exc))
                    continue
                except Refused as exc:
                    self.stats.refused += 1
                    self._note(self.refusals, str(exc))
                    continue
                if self.detections is not None:
                    camera.relay.attach(frame, self.detections.match(
                        frame.stamp.header_ns, self.settings["stamp_tolerance"],
                        self.settings["detections_wait"]))
                frames.append(frame)
                cameras.append(camera)
            if not frames:
                return
            if self.detector is not None:  # one detector batch for every camera's frame
                for frame, objects in zip(frames, self.detector.detect([f.image for f in frames]), strict=True):
                    frame.objects = objects
            records = cameras[0].relay.caption(frames, self.settings["beam"] or None,
                                               [c.relay.source for c in cameras])
            if self.detector is not None:
                for record in records:
                    record.caption.latency_ms["detector"] = self.detector.latency_ms
            for camera, record in zip(cameras, records, strict=True):
                self.stats.add(record)
                self._publish(camera, record)

        def _note(self, warning, reason: str) -> None:
            line = warning.note(reason)
            if line:
                self.get_logger().warning(line)

        def _publish(self, camera, record) -> None:
            _, messages = record_messages(record)
            for topic, typename, fields in messages:
                pub = camera.pubs.get(relative(topic))
                if pub is not None:
                    pub.publish(to_ros(fields, typename, message_class))
            if camera.annotated_pub is not None and camera.annotated_pub.get_subscription_count():
                from edgecap.runtime.overlay import annotate

                header_ns = record.stamps_ns()[0]
                fields = bgr_to_image(annotate(record, min_width=0), header_ns,
                                      record.frame.stamp.frame_id, encoding="bgr8")
                camera.annotated_pub.publish(filled(Image(), fields))

        def close(self) -> None:
            self.stop.set()
            self.worker.join(timeout=5.0)

    return CaptionNode


def _caption_topics():
    from edgecap.ros.captions import (
        ANNOTATIONS,
        ANNOTATIONS_TOPIC,
        CAPTION_TOPIC,
        RECORD_TOPIC,
        STRING,
    )

    return ((CAPTION_TOPIC, STRING), (RECORD_TOPIC, STRING), (ANNOTATIONS_TOPIC, ANNOTATIONS))


def run_node(ros_args: list[str], bundle: str | None = None, out=None) -> int:
    """Start rclpy with `ros_args` (argv-style, `--ros-args ...` passed through), run the node
    until SIGINT / SIGTERM, print the summary; the exit status. EdgecapError for start-up errors."""
    from edgecap.io import stop_on_signals
    from edgecap.runtime.camera import GrabberStats

    rclpy = import_rclpy()
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    out = sys.stdout if out is None else out
    stop = threading.Event()
    context = rclpy.Context()
    try:
        rclpy.init(args=ros_args, context=context, signal_handler_options=SignalHandlerOptions.NO)
    except Exception as exc:  # rclpy's argument parser raises its own RCLError types
        reason = str(exc).split(", at /")[0]  # rcl appends C source locations
        raise EdgecapError(f"ROS arguments {' '.join(ros_args[1:])!r}: {reason}") from None
    node = executor = None
    try:
        with stop_on_signals(stop):
            node = caption_node_class()(bundle, context=context)
            executor = SingleThreadedExecutor(context=context)
            executor.add_node(node)
            while not stop.is_set() and not node.stop.is_set() and context.ok():
                executor.spin_once(timeout_sec=SPIN_SLICE_S)
    finally:
        if node is not None:
            node.close()
            if executor is not None:
                executor.shutdown(timeout_sec=1.0)
            node.destroy_node()
        context.try_shutdown()
    if node.failure is not None:
        raise EdgecapError(f"captioning failed: {node.failure}")
    summary = node.stats.summary
    summary.grabber = GrabberStats.total(c.queue.stats for c in node.cameras)
    summary.stopped_by = "signal" if stop.is_set() else "ROS shutdown"
    print(summary.human(), file=out)
    lost = sum(c.gaps.lost for c in node.cameras)
    print(f"  {lost} frames lost on the way (gaps in the publishers' sequence numbers)", file=out)
    if node.stats.refused:
        print(f"  {node.stats.refused} frames refused (encoding)", file=out)
    if node.detections is not None:
        report = node.detections.report()
        print(f"  detections: {report['received']} received; frames with objects "
              f"{report['matched_frames']}, without {report['unmatched_frames']}", file=out)
    out.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m edgecap.ros2.node --ros-args ...`: argv as rclpy takes it."""
    argv = sys.argv if argv is None else argv
    try:
        return run_node(list(argv))
    except EdgecapError as exc:
        print(f"edgecap ros2: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        print("edgecap ros2: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
