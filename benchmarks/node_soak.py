"""Soak of the ROS 2 node (`edgecap ros2`): a camera at 10 Hz with detections for a long run,
the node's RSS, loss and latency over time, and how long its stop takes.

    python benchmarks/node_soak.py --minutes 60                  # the issue's ask: an hour at 10 Hz
    python benchmarks/node_soak.py --minutes 5 --width 640 --height 480 --qos reliable

This process is the camera (raw frames of the synthetic world, and their detections as JSON on
`detections`, each stamped like its image) and the listener (records and /diagnostics); the node
runs in its own process, as on a robot, on its own ROS_DOMAIN_ID on localhost. Every
`--sample` seconds it records frames sent, frames the node received (its diagnostics), captions
and their capture-to-caption latency, frames lost on the way, and the node's RSS; at the end it
stops the node with SIGTERM and times the exit. Each sample also holds the host's 1-minute load
average: on a shared machine latency and loss follow it. Writes soak.json and soak.png to --out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import REPO, host_info, percentile, save_png, write_json

from edgecap.argtypes import COUNT, POSITIVE, Integer, Parser


def parse_args(argv=None):
    p = Parser(prog="benchmarks/node_soak.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=POSITIVE, default=60.0)
    p.add_argument("--rate", type=POSITIVE, default=10.0, help="camera frames per second")
    p.add_argument("--max-rate", type=POSITIVE, default=10.0, help="the node's max_rate")
    p.add_argument("--width", type=COUNT, default=320)
    p.add_argument("--height", type=COUNT, default=240)
    p.add_argument("--qos", choices=("sensor_data", "reliable"), default="reliable")
    p.add_argument("--sample", type=POSITIVE, default=10.0, help="seconds per sample")
    p.add_argument("--bundle", default=None, help="an exported bundle (default: the demo model's)")
    p.add_argument("--domain", type=Integer(1, 101), default=29, help="ROS_DOMAIN_ID of the run")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "node_soak"))
    return p.parse_args(argv)


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


class Rig:
    """The camera and the listener: one rclpy node in this process, spun on a thread."""

    def __init__(self, args):
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image
        from std_msgs.msg import String

        rclpy.init()
        self.rclpy, self.args = rclpy, args
        self.node = rclpy.create_node("edgecap_soak")
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE
                         if args.qos == "reliable" else ReliabilityPolicy.BEST_EFFORT)
        self.image_pub = self.node.create_publisher(Image, "/soak/image_raw", qos)
        self.detections_pub = self.node.create_publisher(String, "/soak/detections", 10)
        self.latencies: list[float] = []
        self.captions = 0
        self.values: dict[str, str] = {}
        self.lock = threading.Lock()
        self.node.create_subscription(String, "/soak/edgecap/record", self._on_record, 100)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.stop = threading.Event()
        self.spinner = threading.Thread(target=self._spin, daemon=True)
        self.spinner.start()

    def _spin(self):
        while not self.stop.is_set():
            self.rclpy.spin_once(self.node, timeout_sec=0.05)

    def _on_record(self, msg):
        with self.lock:
            self.captions += 1
            self.latencies.append(json.loads(msg.data)["capture_to_caption_ms"])

    def _on_diagnostics(self, msg):
        for status in msg.status:
            if status.name.startswith("edgecap: /soak/"):
                with self.lock:
                    self.values = {kv.key: kv.value for kv in status.values}

    def take(self) -> tuple[int, list[float], dict]:
        with self.lock:
            out = self.captions, self.latencies, dict(self.values)
            self.latencies = []
            return out

    def close(self):
        self.stop.set()
        self.spinner.join()
        self.node.destroy_node()
        self.rclpy.try_shutdown()


def frames(args, count: int = 50):
    """`count` synthetic-world frames at the run's size, their detections, and the messages' fields."""
    import cv2

    from edgecap.data.synth.world import TabletopWorld

    world = TabletopWorld(seed=5, size=96)
    sx, sy = args.width / 96, args.height / 96
    out = []
    for i in range(count):
        image, objects = world.render_frame(i * world.scene_frames)
        image = cv2.resize(image, (args.width, args.height))
        out.append((image, [{"class": o["class"], "box": [o["box"][0] * sx, o["box"][1] * sy,
                                                        o["box"][2] * sx, o["box"][3] * sy]} for o in objects]))
    return out


def run(args, bundle: Path, out: Path) -> dict:
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    from edgecap.ros.images import bgr_to_image, time_msg
    from edgecap.ros2.messages import filled

    env = {**os.environ, "ROS_DOMAIN_ID": str(args.domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "MALLOC_ARENA_MAX": "2"}
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")})
    log = (out / "node.err").open("wb")
    node = subprocess.Popen([sys.executable, "-m", "edgecap", "ros2", str(bundle), "--ros-args", "-r", "__ns:=/soak",
                             "-p", f"qos:={args.qos}", "-p", f"max_rate:={args.max_rate}",
                             "-p", "detections_topic:=detections", "-p", "publish_annotated:=false"],
                            env=env, stdout=subprocess.PIPE, stderr=log, cwd=REPO)
    rig = Rig(args)
    shots = frames(args)
    while rig.node.count_subscribers("/soak/image_raw") == 0:
        if node.poll() is not None:
            raise SystemExit(f"the node exited {node.returncode}: {(out / 'node.err').read_text()[-2000:]}")
        time.sleep(0.2)
    time.sleep(1.0)
    samples, sent, start = [], 0, time.monotonic()
    next_sample = start + args.sample
    end = start + 60 * args.minutes
    while time.monotonic() < end:
        image, objects = shots[sent % len(shots)]
        stamp = time.time_ns()
        rig.detections_pub.publish(String(data=json.dumps({"stamp": time_msg(stamp), "objects": objects})))
        rig.image_pub.publish(filled(Image(), bgr_to_image(image, stamp, "camera", "bgr8")))
        sent += 1
        time.sleep(max(0.0, start + sent / args.rate - time.monotonic()))
        if time.monotonic() >= next_sample:
            next_sample += args.sample
            captions, latencies, values = rig.take()
            samples.append({"t_s": round(time.monotonic() - start, 1), "sent": sent, "captions": captions,
                            "received": int(values.get("received", 0)), "lost": int(values.get("lost", 0)),
                            "dropped": int(values.get("dropped", 0)), "rss_mb": rss_mb(node.pid),
                            "latency_p50_ms": percentile(latencies, 50), "latency_p95_ms": percentile(latencies, 95),
                            "detections_matched_share": values.get("detections_matched_share"),
                            "load_1min": os.getloadavg()[0]})
            print(json.dumps(samples[-1]), flush=True)
    time.sleep(2.0)
    stop_start = time.monotonic()
    node.send_signal(signal.SIGTERM)
    summary = node.communicate(timeout=30)[0].decode()
    stop_s = time.monotonic() - stop_start
    rig.close()
    return {"samples": samples, "sent": sent, "stop_s": round(stop_s, 3), "exit_code": node.returncode,
            "node_summary": summary}


def plot(samples: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t_s"] / 60 for s in samples]
    loaded = all("load_1min" in s for s in samples)   # runs before it was recorded have no load panel
    fig, axes = plt.subplots(4 if loaded else 3, 1, figsize=(8, 10 if loaded else 8), sharex=True)
    axes[0].plot(t, [s["rss_mb"] for s in samples])
    axes[0].set_ylabel("node RSS (MB)")
    axes[1].plot(t, [s["latency_p50_ms"] for s in samples], label="p50")
    axes[1].plot(t, [s["latency_p95_ms"] for s in samples], label="p95")
    axes[1].set_ylabel("capture to caption (ms)")
    axes[1].legend()
    axes[2].plot(t, [s["sent"] - s["received"] for s in samples], label="sent - received")
    axes[2].plot(t, [s["lost"] for s in samples], label="lost (sequence gaps)")
    axes[2].set_ylabel("frames")
    axes[2].legend()
    if loaded:   # a shared machine: latency and loss follow its load
        axes[3].plot(t, [s["load_1min"] for s in samples])
        axes[3].set_ylabel("host load (1 min)")
    axes[-1].set_xlabel("minutes")
    fig.suptitle("edgecap ros2 soak")
    return save_png(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"benchmarks/node_soak.py: error: --out {out} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)
    if args.bundle:
        bundle = Path(args.bundle)
    else:
        from edgecap.export.demo_command import demo_checkpoint, ensure_bundle

        bundle = ensure_bundle(demo_checkpoint(), out / "export", beam=3, log=lambda msg: print(msg, flush=True))
    result = run(args, bundle, out)
    write_json(out / "soak.json", {"args": vars(args), "host": host_info(), **result})
    print(f"soak: {result['sent']} frames sent over {args.minutes:g} min; stop took {result['stop_s']} s, "
          f"exit {result['exit_code']}; {plot(result['samples'], out / 'soak.png')}")
    print(result["node_summary"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
