"""How long the ROS 2 node (`edgecap ros2`) takes to stop on SIGTERM, in the cases issue 42
measured: idle (no image), captioning a 10 Hz camera with its detections, and captioning while
it waits for detections that never come (the signal finds the loop mid-wait).

    python benchmarks/node_stop.py --repeats 5
    python benchmarks/node_stop.py --cases idle --repeats 20

Each repeat starts a fresh node in its own process (on its own ROS_DOMAIN_ID, localhost only),
waits for its first caption (idle: for it to be up), lets it run `--run` seconds, sends SIGTERM
and times the exit from the signal to the process's end, with its exit code. This process is the
camera (and the detector). The stop after a long run is node_soak.py's last number. Writes
stop.json to --out and prints the median and the slowest stop of each case.
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

from _common import REPO, host_info, percentile, write_json
from node_soak import frames

from edgecap.argtypes import COUNT, POSITIVE, Integer, Parser

CASES = {   # name: (node parameters, the camera publishes, the detector publishes)
    "idle": ([], False, False),
    "detections": (["detections_topic:=detections", "qos:=reliable"], True, True),
    "waiting for detections": (["detections_topic:=detections", "detections_wait:=3.0"], True, False),
}


def parse_args(argv=None):
    p = Parser(prog="benchmarks/node_stop.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    p.add_argument("--repeats", type=COUNT, default=5)
    p.add_argument("--run", type=POSITIVE, default=3.0, help="seconds the node runs before the signal")
    p.add_argument("--rate", type=POSITIVE, default=10.0, help="camera frames per second")
    p.add_argument("--width", type=COUNT, default=320)
    p.add_argument("--height", type=COUNT, default=240)
    p.add_argument("--bundle", default=None, help="an exported bundle (default: the demo model's)")
    p.add_argument("--domain", type=Integer(1, 101), default=28, help="ROS_DOMAIN_ID of the runs")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "node_stop"))
    return p.parse_args(argv)


class Camera:
    """A camera (and detector) publishing on a thread while `on` is set; counts captions heard."""

    def __init__(self, args):
        import rclpy
        from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image
        from std_msgs.msg import String

        rclpy.init()
        self.rclpy, self.args, self.shots = rclpy, args, frames(args)
        self.node = rclpy.create_node("edgecap_stop_camera")
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.image_pub = self.node.create_publisher(Image, "/stop/image_raw", qos)
        self.detections_pub = self.node.create_publisher(String, "/stop/detections", 10)
        self.captions = 0
        self.node.create_subscription(String, "/stop/edgecap/record", self._on_record, 10)
        self.on, self.detect, self.closed = threading.Event(), False, threading.Event()
        threading.Thread(target=self._spin, daemon=True).start()
        threading.Thread(target=self._publish, daemon=True).start()

    def _on_record(self, msg):
        self.captions += 1

    def _spin(self):
        while not self.closed.is_set():
            self.rclpy.spin_once(self.node, timeout_sec=0.05)

    def _publish(self):
        from sensor_msgs.msg import Image
        from std_msgs.msg import String

        from edgecap.ros.images import bgr_to_image, time_msg
        from edgecap.ros2.messages import filled

        sent = 0
        while not self.closed.is_set():
            if not self.on.wait(0.1):
                continue
            image, objects = self.shots[sent % len(self.shots)]
            stamp = time.time_ns()
            if self.detect:
                self.detections_pub.publish(String(data=json.dumps({"stamp": time_msg(stamp), "objects": objects})))
            self.image_pub.publish(filled(Image(), bgr_to_image(image, stamp, "camera", "bgr8")))
            sent += 1
            time.sleep(1.0 / self.args.rate)

    def close(self):
        self.closed.set()
        self.node.destroy_node()
        self.rclpy.try_shutdown()


def stop_once(args, bundle: Path, camera: Camera, case: str, log: Path) -> dict:
    params, publish, detect = CASES[case]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    ros = [a for p in params for a in ("-p", p)]
    with log.open("wb") as err:
        node = subprocess.Popen([sys.executable, "-m", "edgecap", "ros2", str(bundle), "--ros-args", "-r",
                                 "__ns:=/stop", *ros], env=env, stdout=subprocess.PIPE, stderr=err, cwd=REPO)
    while b"captioning" not in log.read_bytes():
        if node.poll() is not None:
            raise SystemExit(f"the node exited {node.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    camera.captions, camera.detect = 0, detect
    if publish:
        camera.on.set()
        while camera.captions == 0 and node.poll() is None:   # captioning (a missed detector: slowly)
            time.sleep(0.05)
    time.sleep(args.run)
    start = time.monotonic()
    node.send_signal(signal.SIGTERM)
    out = node.communicate(timeout=60)[0].decode()
    seconds = time.monotonic() - start
    camera.on.clear()
    return {"case": case, "stop_s": round(seconds, 3), "exit_code": node.returncode,
            "summary": out.strip().splitlines()[0] if out.strip() else ""}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update({"ROS_DOMAIN_ID": str(args.domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"})
    if args.bundle:
        bundle = Path(args.bundle)
    else:
        from edgecap.export.demo_command import demo_checkpoint, ensure_bundle

        bundle = ensure_bundle(demo_checkpoint(), out / "export", beam=3, log=lambda msg: print(msg, flush=True))
    camera = Camera(args)
    runs = []
    try:
        for case in args.cases:
            for _ in range(args.repeats):
                runs.append(stop_once(args, bundle, camera, case, out / "node.err"))
                print(json.dumps(runs[-1]), flush=True)
    finally:
        camera.close()
    cases = {}
    for case in args.cases:
        times = [r["stop_s"] for r in runs if r["case"] == case]
        cases[case] = {"median_s": round(percentile(times, 50), 3), "max_s": max(times),
                       "exit_codes": sorted({r["exit_code"] for r in runs if r["case"] == case})}
        print(f"{case}: median {cases[case]['median_s']:.2f} s, slowest {cases[case]['max_s']:.2f} s "
              f"of {len(times)}; exit codes {cases[case]['exit_codes']}")
    write_json(out / "stop.json", {"args": vars(args), "host": host_info(), "cases": cases, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
