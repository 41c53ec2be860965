"""The ROS 2 captioning node: camera images in, stamped captions (and coverage, with detections
or a detector) out.

    edgecap ros2 BUNDLE --ros-args -r __ns:=/front -p max_rate:=5
    python -m edgecap.ros2 --lifecycle --ros-args -p bundle:=BUNDLE -r image_raw:=/camera/image_raw

Only `edgecap ros2` (edgecap/ros2/command.py) imports this module, once rclpy is found: rclpy
and the message packages are imported here at module level, as any ROS node does.

Topics are relative to the node's namespace (one node per camera, side by side):

    in   image_raw               sensor_msgs/Image (or CompressedImage with compressed:=true)
    in   detections              with detections_topic: std_msgs/String JSON or Detection2DArray
                                 (or detector:=MODEL.onnx: an object detector run on the frames)
    out  edgecap/caption         std_msgs/String               the caption
    out  edgecap/caption_marker  visualization_msgs/Marker     the caption, stamped with the image's header
    out  edgecap/record          std_msgs/String               the JSON record (stamps, latency, coverage)
    out  edgecap/annotated       sensor_msgs/Image             the frame with boxes and caption, its own size
    out  edgecap/annotations     foxglove_msgs/ImageAnnotations, when foxglove_msgs is importable
    out  /diagnostics            diagnostic_msgs/DiagnosticArray (health, rates, loss, latency, detector)
    srv  edgecap/enable          std_srvs/SetBool              pause / resume captioning
    srv  edgecap/caption_now     std_srvs/Trigger              the caption of the next frame

The image subscriptions feed newest-frame slots (frames.py), which feed the runtime's one
captioning loop (edgecap.runtime.loop) on a thread; the publishers are the loop's sinks.
Parameters are the table in params.py, read into one frozen NodeParams that a parameter change
replaces whole. `LifecycleCaptionNode` is the managed variant: configure loads the bundle and
subscribes, activate captions, deactivate pauses, cleanup lets everything go.

Signals are Python's (edgecap.io.stop_on_signals), not rclpy's: the executor spins in short
slices, so SIGINT / SIGTERM end the node within a fraction of a second, exit 0, with the
summary `edgecap run` prints.
"""

from __future__ import annotations

import sys
import threading
import time

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.event_handler import SubscriptionEventCallbacks, UnsupportedEventTypeError
from rclpy.exceptions import InvalidParameterValueException
from rclpy.executors import MultiThreadedExecutor
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos_overriding_options import QoSOverridingOptions
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import Image
from std_msgs.msg import String
from std_srvs.srv import SetBool, Trigger
from visualization_msgs.msg import Marker

from edgecap.errors import EdgecapError, did_you_mean
from edgecap.io import stop_on_signals
from edgecap.ros.captions import (
    ANNOTATIONS,
    ANNOTATIONS_TOPIC,
    CAPTION_TOPIC,
    RECORD_TOPIC,
    STRING,
    to_ros,
)
from edgecap.ros.images import COMPRESSED, IMAGE, bgr_to_image
from edgecap.runtime.camera import GrabberStats
from edgecap.runtime.captioner import Captioner
from edgecap.runtime.detector import Detector, DetectorHook, coverage_vocabulary
from edgecap.runtime.loop import Camera, run_cameras
from edgecap.runtime.mcap_sink import record_messages
from edgecap.runtime.overlay import annotate
from edgecap.runtime.records import Summary
from edgecap.runtime.scoring import CoverageAnnotator, bundle_vectors

from .detections import DetectionMatcher, StampedObjects, json_objects, vision_objects
from .frames import ImageSlot
from .messages import (
    CAPTION_MARKER_TOPIC,
    NextCaption,
    caption_marker,
    filled,
    message_class,
    relative,
)
from .params import BY_NAME, PARAMS, NodeParams, ParameterError, changed, check_all
from .relay import CaptionRelay
from .stats import WINDOW_S, CameraHealth, CountedWarning, NodeStats, SequenceGaps, health

NODE_NAME = "edgecap_captioner"
SPIN_SLICE_S = 0.1                 # how long one executor wait may block a signal's handling
WATCH_PERIOD_S = 1.0
DETECTIONS_TOPIC_DEPTH = 10
# ROS parameters every node has: not typos of ours (qos_overrides.* are checked once declared)
COMMON_PARAMETERS = ("use_sim_time", "start_type_description_service")
ANNOTATED_TOPIC = "edgecap/annotated"
CAPTION_OUTPUTS = ((CAPTION_TOPIC, STRING), (RECORD_TOPIC, STRING), (ANNOTATIONS_TOPIC, ANNOTATIONS))


class _LiveOptions:
    """The loop's options (edgecap.runtime.loop.LoopOptions), read from the node's current
    parameters at every round: max_rate, beam and enabled change while it runs."""

    batch, frames, latency_budget_ms = 1, None, None

    def __init__(self, node):
        self.node = node

    @property
    def max_fps(self) -> float:
        return self.node.params.max_rate

    @property
    def beam(self) -> int | None:
        return self.node.params.beam or None

    @property
    def paused(self) -> bool:
        return not (self.node.params.enabled and self.node.active) and not self.node.next_caption.pending


class Captioning:
    """What both node classes do (a mixin over rclpy's Node or LifecycleNode): parameters at
    construction; `_open` loads the bundle, subscribes, advertises and starts the loop's
    thread; `_close` stops and lets go of it all."""

    # -- parameters ------------------------------------------------------------------------
    def _declare_parameters(self, bundle: str | None) -> None:
        for p in PARAMS:
            try:
                self.declare_parameter(p.name, p.default, _descriptor(p))
            except InvalidParameterValueException as exc:  # out of the descriptor's range: our one line
                override = (getattr(self, "_parameter_overrides", {}) or {}).get(p.name)
                if override is not None:
                    p.check(override.value)
                raise ParameterError(f"parameter {p.name}: {exc}") from None
        values = {p.name: self.get_parameter(p.name).value for p in PARAMS}
        if bundle is not None:
            values["bundle"] = bundle
        self.params: NodeParams = check_all(values)
        if not self.params.bundle:
            raise ParameterError("parameter bundle: set it to a bundle directory "
                                 "(edgecap ros2 BUNDLE, -p bundle:=DIR or --params-file)")
        self.active = False
        self.opened = False
        self.failure: BaseException | None = None
        self.stop = threading.Event()
        self.next_caption = NextCaption()
        self.add_on_set_parameters_callback(self._on_set_parameters)

    def _on_set_parameters(self, params) -> SetParametersResult:
        values = {p.name: p.value for p in params if p.name in BY_NAME}
        for name in values:
            if not BY_NAME[name].live:
                return SetParametersResult(successful=False, reason=f"parameter {name} is read only while running")
        try:
            new = changed(self.params, values)
            if new.beam and self.opened:
                self._check_beam(new.beam)
        except EdgecapError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        if new.enabled and not self.params.enabled:
            self._discard_waiting()
        self.params = new  # one assignment: the loop sees the old parameters or the new, never a mix
        for name in values:
            self.get_logger().info(f"{name} is now {getattr(new, name)}")
        return SetParametersResult(successful=True)

    def _discard_waiting(self) -> None:
        """Resuming: the frames that came while paused are old; caption from the next one."""
        for camera in getattr(self, "cameras", []) if self.opened else []:
            camera.grabber.discard()

    def _check_beam(self, beam: int) -> int:
        try:
            return self.captioner.check_beam(beam)
        except EdgecapError as exc:
            raise ParameterError(f"parameter beam: {exc}") from None

    def _warn_unknown_parameters(self) -> None:
        # rclpy keeps the -p / --params-file values for this node there (no public accessor)
        for name in getattr(self, "_parameter_overrides", {}) or {}:
            if not self.has_parameter(name) and not name.startswith(COMMON_PARAMETERS):
                hint = (" (qos_overrides name the node's resolved topics: "
                        f"{', '.join(c.topic for c in self.cameras)})" if name.startswith("qos_overrides.")
                        else did_you_mean(name, BY_NAME))
                self.get_logger().warning(f"parameter {name!r} is not one of this node's; ignored{hint}")

    # -- start -----------------------------------------------------------------------------
    def _open(self) -> None:
        """Load the bundle, subscribe, advertise, start the loop's thread (paused unless active)."""
        p = self.params
        self.detector = self._open_detector() if p.detector else None  # before the bundle: a bad file fails fast
        self.captioner = Captioner.from_bundle(p.bundle, threads=p.threads, spin=p.spin)
        if p.beam:
            self._check_beam(p.beam)
        self.captioner.warm_up()
        self.msgtype = COMPRESSED if p.compressed else IMAGE
        self._entities: list = []
        self.matcher = self._open_detections() if p.detections_topic else None
        self.coverage = self._open_coverage() if self.matcher or self.detector else None
        self.cameras = self._open_cameras()
        self.image_topic = ",".join(c.topic for c in self.cameras)
        self.diagnostics_pub = self._keep(self.create_publisher(DiagnosticArray, "/diagnostics", 10))
        services = MutuallyExclusiveCallbackGroup(), MutuallyExclusiveCallbackGroup()
        self._keep(self.create_service(SetBool, "edgecap/enable", self._on_enable, callback_group=services[0]))
        self._keep(self.create_service(Trigger, "edgecap/caption_now", self._on_caption_now,
                                       callback_group=services[1]))
        self.started = time.monotonic()
        self._keep(self.create_timer(p.diagnostics_period, self._diagnose))
        self._keep(self.create_timer(WATCH_PERIOD_S, self._watch))
        self._warn_unknown_parameters()
        self.worker = threading.Thread(target=self._work, name="edgecap-captioner", daemon=True)
        self.worker.start()
        self.opened = True

    def _keep(self, entity):
        """Remember a subscription, publisher, service or timer, to let go of it in `_close`."""
        self._entities.append(entity)
        return entity

    def _open_cameras(self) -> list[Camera]:
        p = self.params
        topics = [t.strip() for t in p.image_topics.split(",") if t.strip()] or [p.image_topic]
        if len(topics) > 1 and p.detections_topic:
            raise ParameterError(f"parameter detections_topic: detections are matched to one image topic, "
                                 f"and image_topics names {len(topics)}; run one node per camera for coverage")
        several = len(topics) > 1
        self.fresh = threading.Event()
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=p.qos_depth,
                         reliability=ReliabilityPolicy.RELIABLE if p.qos == "reliable" else ReliabilityPolicy.BEST_EFFORT,
                         durability=DurabilityPolicy.VOLATILE)
        self.stats = NodeStats()   # before the subscriptions: their callbacks count into it
        cameras, self.outputs = [], []
        for index, topic in enumerate(topics):
            slot = ImageSlot(CaptionRelay(self.msgtype, p.allow_non_colour), p.queue_depth,
                             on_publish=lambda msg: self.fresh.set(), log=self.get_logger().warning)
            sub = self._subscribe(index, topic, slot, qos)
            # one camera: outputs in the node's namespace; several: each in its camera's
            prefix = sub.topic_name.rpartition("/")[0] + "/" if several else ""
            cameras.append(Camera(index if several else None, slot, Summary(f"ros2:{sub.topic_name}", camera=index
                                                                               if several else None)))
            cameras[-1].topic = sub.topic_name
            cameras[-1].summary.grabber = slot.stats
            self.outputs.append(self._advertise(prefix))
        names = [outputs[relative(CAPTION_TOPIC)].topic_name for outputs in self.outputs]
        if len(set(names)) < len(names):
            raise ParameterError(f"parameter image_topics: {p.image_topics!r} puts two cameras' captions on "
                                 "one topic; name topics in different namespaces")
        self.summary = (Summary(f"ros2:{','.join(c.topic for c in cameras)}", cameras=[c.summary for c in cameras])
                        if several else cameras[0].summary)
        self.stats.summary = self.summary
        return cameras

    def _subscribe(self, index: int, topic: str, slot: ImageSlot, qos: QoSProfile):
        """Camera `index`'s image subscription: frames into its slot, frames lost counted from
        sequence gaps and, where the rmw reports them, from its message-lost events (stats.py)."""
        gaps, resolved = SequenceGaps(), self.resolve_topic_name(topic)
        kwargs = {"qos_overriding_options": QoSOverridingOptions.with_default_policies()}
        events = SubscriptionEventCallbacks(message_lost=lambda info: self.stats.lost_by_middleware(
            info.total_count_change, camera=index))
        args = (message_class(self.msgtype), topic,
                lambda msg, info: self._on_image(index, resolved, slot, gaps, msg, info), qos)
        try:
            sub = self.create_subscription(*args, event_callbacks=events, **kwargs)
            self.stats.counts_middleware_loss()
        except UnsupportedEventTypeError:  # this rmw has no message-lost event: the gaps alone
            sub = self.create_subscription(*args, **kwargs)
        return self._keep(sub)

    def _advertise(self, prefix: str) -> dict:
        """One camera's publishers, {relative topic: publisher}; every one exists before the
        first frame, so subscribers match at once. Output QoS from the parameters and qos_overrides."""
        p = self.params
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=p.output_depth, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL if p.output_durability == "transient_local"
                         else DurabilityPolicy.VOLATILE)
        overrides = QoSOverridingOptions.with_default_policies()
        outputs = {}
        for topic, typename in (*CAPTION_OUTPUTS, (CAPTION_MARKER_TOPIC, "visualization_msgs/msg/Marker")):
            try:
                cls = message_class(typename)
            except ImportError:
                continue  # foxglove_msgs is not on PyPI; the annotated image carries the same marks
            outputs[relative(topic)] = self._keep(self.create_publisher(cls, prefix + relative(topic), qos,
                                                                        qos_overriding_options=overrides))
        if p.publish_annotated:
            outputs[ANNOTATED_TOPIC] = self._keep(self.create_publisher(Image, prefix + ANNOTATED_TOPIC, qos))
        return outputs

    def _open_detections(self) -> DetectionMatcher:
        p = self.params
        if p.detections_format == "vision_msgs":
            try:
                cls = message_class("vision_msgs/msg/Detection2DArray")
            except ImportError:
                raise EdgecapError("parameter detections_format: vision_msgs is not importable "
                                   "(apt install ros-$ROS_DISTRO-vision-msgs; it is not on PyPI): "
                                   "use detections_format:=json") from None
            parse = vision_objects
        else:
            cls, parse = String, (lambda msg: json_objects(msg.data))
        objects = StampedObjects()

        ignored = CountedWarning("ignored detections in")

        def on_detections(msg):
            try:
                objects.add(*parse(msg))
            except EdgecapError as exc:
                if line := ignored.note(str(exc)):
                    self.get_logger().warning(line)

        self._keep(self.create_subscription(cls, p.detections_topic, on_detections, QoSProfile(
            history=HistoryPolicy.KEEP_LAST, depth=DETECTIONS_TOPIC_DEPTH, reliability=ReliabilityPolicy.BEST_EFFORT)))
        return DetectionMatcher(objects, lambda: self.params, log=self.get_logger().warning)

    def _open_detector(self) -> Detector:
        """The `detector` parameter's model (as `edgecap run --detector`), with the captioner's
        threads and spin; every camera's frame of a round goes through it in one batch."""
        p = self.params
        if p.detections_topic:
            raise ParameterError("parameter detector: detections_topic already gives the frames' objects; "
                                 "set one of them")
        try:
            detector = Detector.load(p.detector, threads=p.threads, spin=p.spin, min_score=p.detector_min_score,
                                     iou=p.detector_iou)
        except EdgecapError as exc:
            raise ParameterError(f"parameter detector: {exc}") from None
        detector.warm_up()
        return detector

    def _open_coverage(self) -> CoverageAnnotator:
        """The scorer of the captions against the objects a detections topic or the detector
        gives: the detector's classes (else ACVR's, joined by the objects' own names) and the
        word vectors the bundle carries."""
        vocabulary = None if self.detector is None else coverage_vocabulary(self.detector)
        coverage = CoverageAnnotator(log=self.get_logger().warning, vocabulary=vocabulary,
                                     vectors=bundle_vectors(self.captioner.bundle))
        coverage.warm_up()
        return coverage

    def _objects_hook(self):
        """The loop's `annotate_objects`: the detections topic's matcher, the detector's hook
        (its time as the records' "detector" latency), or None (no objects known)."""
        return self.matcher or (DetectorHook(self.detector) if self.detector is not None else None)

    # -- callbacks (executor threads) --------------------------------------------------------
    def _on_image(self, index: int, topic: str, slot: ImageSlot, gaps: SequenceGaps, msg, info) -> None:
        gid = info.get("publisher_gid")                # Kilted on; Jazzy's info lacks it
        lost = 0
        if isinstance(gid, dict):
            lost = gaps.note(bytes(gid["data"]).hex(), info.get("publication_sequence_number"))
        elif self.count_publishers(topic) <= 1:      # one numbering on the topic
            lost = gaps.note(topic, info.get("publication_sequence_number"))
        now = time.monotonic()
        self.stats.arrived(lost, now, camera=index)
        slot.put(msg, now, time.time_ns())

    def _on_enable(self, request, response):
        result = self.set_parameters([Parameter("enabled", value=bool(request.data))])[0]
        response.success = result.successful
        response.message = ("captioning" if request.data else "paused") if result.successful else result.reason
        return response

    def _on_caption_now(self, request, response):
        record = self.next_caption.wait(self.params.trigger_timeout, self.stop)
        response.success = record is not None
        response.message = record.caption.text if record is not None else (
            f"no frame captioned within {self.params.trigger_timeout:g} s (no image arriving?)")
        return response

    def _watch(self) -> None:
        """Until a camera's first image: warn once when its topic's publishers use another type
        (checked every tick, as publishers come and go), and once when none came in time."""
        waited = time.monotonic() - self.started
        for camera in self.cameras:
            if camera.grabber.last_publish is not None:
                continue
            warned = camera.__dict__.setdefault("warned", set())
            types = sorted({i.topic_type for i in self.get_publishers_info_by_topic(camera.topic)})
            if types and self.msgtype not in types and "type" not in warned:
                warned.add("type")
                hint = ("compressed:=false" if IMAGE in types else
                        "compressed:=true" if COMPRESSED in types else "image_topic to an image topic")
                self.get_logger().warning(f"{camera.topic} carries {', '.join(types)}, not {self.msgtype}: "
                                          f"no image can arrive; set {hint}")
            if waited >= self.params.no_image_warning and "idle" not in warned:
                warned.add("idle")
                self.get_logger().warning(f"no image on {camera.topic} after {waited:.1f} s "
                                          f"({self.count_publishers(camera.topic)} publishers)")

    def _diagnose(self) -> None:
        p, now = self.params, time.monotonic()
        rate, _ = self.stats.window(now)
        paused = _LiveOptions(self).paused
        cameras = [CameraHealth(c.topic, None if c.grabber.last_publish is None else now - c.grabber.last_publish,
                                c.grabber.period(), c.grabber.input_rate(now, WINDOW_S), c.grabber.stats.captured,
                                c.grabber.refused) for c in self.cameras]
        level, message = health(cameras, rate, self.stats.loss_share(now), p, now - self.started, paused,
                                self.matcher is None or self.matcher.waiting)
        extra = {"bundle": p.bundle, "providers": ",".join(self.captioner.bundle.providers),
                 "beam": str(p.beam or self.captioner.beam), "max_rate": f"{p.max_rate:g}",
                 "enabled": str(p.enabled and self.active).lower(), "image_topic": self.image_topic,
                 "qos": f"{p.qos} depth {p.qos_depth}", "refused": str(sum(c.refused for c in cameras))}
        if self.matcher is not None:
            extra.update(self.matcher.health(now))
        if self.detector is not None:
            extra.update({"detector": str(self.detector.path), "detector_ms": f"{self.detector.latency_ms:.1f}"})
        for camera in cameras if len(cameras) > 1 else []:
            extra[f"received {camera.topic}"] = str(camera.received)
        self.summary.grabber = _total_stats(self.cameras)
        status = DiagnosticStatus(level=bytes([level]), name=f"edgecap: {self.get_fully_qualified_name()}",
                                  message=message, hardware_id=p.bundle,
                                  values=[KeyValue(key=k, value=v) for k, v in self.stats.values(extra)])
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        self.diagnostics_pub.publish(array)

    # -- the captioning thread ---------------------------------------------------------------
    def _work(self) -> None:
        try:
            run_cameras(self.captioner, self.cameras, self.summary, [self.stats.add, self._publish, self.next_caption],
                        _LiveOptions(self), self.stop, self.fresh, annotate_objects=self._objects_hook(),
                        coverage=self.coverage, stall_s=None)
        except Exception as exc:  # an engine failure: end the node with its one line
            self.failure = exc
            self.stop.set()

    def _publish(self, record) -> None:
        index = record.camera or 0
        outputs = self.outputs[index]
        for topic, typename, fields in record_messages(record)[1]:
            if relative(topic) in outputs:
                outputs[relative(topic)].publish(to_ros(fields, typename, message_class))
        outputs[relative(CAPTION_MARKER_TOPIC)].publish(filled(Marker(), caption_marker(record, index)))
        annotated = outputs.get(ANNOTATED_TOPIC)
        if annotated is not None and annotated.get_subscription_count():
            header_ns = record.stamps_ns()[0]
            fields = bgr_to_image(annotate(record, min_width=0, over=True), header_ns,
                                  record.frame.stamp.frame_id, encoding="bgr8")
            annotated.publish(filled(Image(), fields))

    # -- stop ---------------------------------------------------------------------------------
    def _close(self) -> None:
        """Stop the loop (it finishes its batch) and let go of subscriptions and publishers."""
        self.stop.set()
        if not self.opened:
            return
        for camera in self.cameras:
            camera.grabber.close()
        if self.matcher is not None:
            self.matcher.objects.close()
        self.next_caption.wake()
        self.worker.join(timeout=5.0)
        self.summary.grabber = _total_stats(self.cameras) if len(self.cameras) > 1 else self.cameras[0].grabber.stats
        self.opened = False

    def _release(self) -> None:
        for entity in reversed(getattr(self, "_entities", [])):
            for destroy in ("destroy_subscription", "destroy_publisher", "destroy_service", "destroy_timer"):
                try:
                    getattr(self, destroy)(entity)
                    break
                except Exception:  # rclpy raises for an entity of another kind
                    continue
        self._entities = []


def _total_stats(cameras):
    return GrabberStats.total(c.grabber.stats for c in cameras)


def _descriptor(p) -> ParameterDescriptor:
    """The ROS descriptor of a PARAMS row: its doc, whether it may change, and its range."""
    descriptor = ParameterDescriptor(description=p.doc, dynamic_typing=True, read_only=not p.live)
    bounds = p.descriptor_range()
    if bounds is not None:
        kind, low, high = bounds
        if kind == "integer_range":
            descriptor.integer_range = [IntegerRange(from_value=low, to_value=high, step=1)]
        else:
            descriptor.floating_point_range = [FloatingPointRange(from_value=low, to_value=high, step=0.0)]
    return descriptor


class CaptionNode(Captioning, Node):
    """The plain node: loads the bundle and captions from construction on."""

    def __init__(self, bundle: str | None = None, context=None):
        Node.__init__(self, NODE_NAME, context=context)
        self._declare_parameters(bundle)
        self.active = True
        self._open()
        self.get_logger().info(self._started_line())

    def _started_line(self) -> str:
        p = self.params
        outputs = [o[relative(CAPTION_TOPIC)].topic_name for o in self.outputs]
        return (f"captioning {self.image_topic} ({self.msgtype}, {p.qos} depth {p.qos_depth}) with {p.bundle} "
                f"at up to {p.max_rate:g}/s; captions on {', '.join(outputs)}")

    def close(self) -> None:
        self._close()


class LifecycleCaptionNode(Captioning, LifecycleNode):
    """The managed node: configure loads the bundle, subscribes and advertises; activate
    captions; deactivate pauses (frames meanwhile are dropped); cleanup lets it all go."""

    def __init__(self, bundle: str | None = None, context=None):
        LifecycleNode.__init__(self, NODE_NAME, context=context)
        self._declare_parameters(bundle)
        self.get_logger().info("unconfigured: configure loads the bundle, activate captions")

    def on_configure(self, state) -> TransitionCallbackReturn:
        try:
            self._open()
        except EdgecapError as exc:
            self.get_logger().error(f"configure failed: {exc}")
            self._close()
            self._release()
            return TransitionCallbackReturn.FAILURE
        self.get_logger().info(f"configured: {self.image_topic} with {self.params.bundle}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state) -> TransitionCallbackReturn:
        self._discard_waiting()
        self.active = True
        self.get_logger().info(CaptionNode._started_line(self))
        return super().on_activate(state)

    def on_deactivate(self, state) -> TransitionCallbackReturn:
        self.active = False
        self.get_logger().info("inactive: captioning paused")
        return super().on_deactivate(state)

    def on_cleanup(self, state) -> TransitionCallbackReturn:
        self._close()
        self._release()
        self.stop = threading.Event()  # a later configure starts afresh
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state) -> TransitionCallbackReturn:
        self._close()
        return TransitionCallbackReturn.SUCCESS

    def close(self) -> None:
        self._close()


def run_node(ros_args: list[str], bundle: str | None = None, lifecycle: bool = False, out=None) -> int:
    """Start rclpy with `ros_args` (argv-style, `--ros-args ...` passed through), run the node
    until SIGINT / SIGTERM, print the summary; the exit status. EdgecapError for start-up errors."""
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
            node = (LifecycleCaptionNode if lifecycle else CaptionNode)(bundle, context=context)
            executor = MultiThreadedExecutor(num_threads=4, context=context)
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
    _print_summary(node, "signal" if stop.is_set() else "ROS shutdown", out)
    return 0


def _print_summary(node, stopped_by: str, out) -> None:
    if not getattr(node, "cameras", None):  # a lifecycle node never configured
        print(f"summary: 0 frames captioned (never configured); stopped by {stopped_by}", file=out)
        return
    summary = node.summary
    summary.stopped_by = stopped_by
    print(summary.human(), file=out)
    stats = node.stats
    middleware = ("" if stats.middleware_lost is None else
                  f", the middleware's message-lost events {sum(stats.middleware_lost.values())}")
    print(f"  {stats.lost} frames lost on the way (the larger count of: gaps in the publishers' sequence "
          f"numbers {sum(stats.gap_lost.values())}{middleware})", file=out)
    refused = sum(c.grabber.refused for c in node.cameras)
    if refused:
        print(f"  {refused} frames refused (encoding)", file=out)
    if node.matcher is not None:
        report = node.matcher.objects.report()
        outside = report["boxes_outside_frame"]
        print(f"  detections: {report['received']} received; frames with objects "
              f"{report['matched_frames']}, without {report['unmatched_frames']}"
              + (f"; {outside} boxes wholly outside their frame left out" if outside else ""), file=out)
    if node.detector is not None:
        print(f"  detector: {node.detector.path} ({node.detector.layout}, {node.detector.n_classes} classes, "
              f"min score {node.detector.min_score:g}, NMS IoU {node.detector.iou:g})", file=out)
    out.flush()
