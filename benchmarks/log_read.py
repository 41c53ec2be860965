"""Reading camera images out of robot logs: mcap + mcap-ros2-support vs rosbags, per storage.

    python benchmarks/log_read.py [--frames 150] [--size 640x480] [--repeats 5] [--out DIR] [--quick]

Writes one log per storage with the libraries' own writers (a bare .mcap, rosbag2 in MCAP
storage and in SQLite3 storage; zstd chunks for MCAP as `ros2 bag record` does), with
`--frames` camera images of noise-free synthetic frames as sensor_msgs/Image rgb8 and as
CompressedImage jpeg, and times reading every image of the topic into an OpenCV BGR frame
(what `edgecap run` does per message) with each reader that supports the storage:

    mcap       mcap SeekingReader + mcap-ros2-support decoder (edgecap.ros.mcap_log.McapLog)
    rosbags    rosbags + its CDR deserialiser: AnyReader on MCAP (edgecap.ros.rosbags_log.RosbagsLog),
               its SQLite3 storage reader on .db3 files (edgecap.ros.rosbags_log.SqliteLog)
    rosbags AnyReader
               on SQLite3 too, rosbags' AnyReader on the directory (RosbagsLog): what edgecap
               read .db3 logs with before SqliteLog, for comparison

`edgecap run` reads MCAP with `mcap` and SQLite3 with `rosbags` (its storage reader).

Reports the median over `--repeats` after a warm-up read, per message and as a ratio, and
writes results/log_read/log_read.json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, host_info, print_table, timed, write_json  # noqa: E402

from edgecap.argtypes import COUNT, Integer, Parser  # noqa: E402

SIDE = Integer(16, 8192)


def camera_size(text: str) -> tuple[int, int]:
    """--size WIDTHxHEIGHT -> (width, height)."""
    parts = text.lower().split("x")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT (e.g. 640x480), got {text!r}")
    return SIDE(parts[0]), SIDE(parts[1])


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=COUNT, default=150)
    p.add_argument("--size", type=camera_size, default="640x480", help="WIDTHxHEIGHT of the camera images")
    p.add_argument("--repeats", type=COUNT, default=5)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "log_read"))
    p.add_argument("--quick", action="store_true", help="a few small frames, one repeat (tests)")
    args = p.parse_args(argv)
    args.width, args.height = args.size
    if args.quick:
        args.frames, args.width, args.height, args.repeats = 6, 64, 48, 1
    return args


def camera_frames(args):
    import cv2

    from edgecap.data.synth import TabletopWorld

    world = TabletopWorld(seed=3, size=max(args.width, args.height))
    for t in range(args.frames):
        image = world.render_frame(t)[0]
        yield t, cv2.resize(image, (args.width, args.height), interpolation=cv2.INTER_LINEAR)


def write_logs(args, workdir: Path) -> dict[str, Path]:
    """{storage: path}, each holding /camera/image_raw (Image) and /camera/compressed (jpeg)."""
    from mcap_ros2.writer import Writer as McapWriter
    from rosbags.rosbag2 import StoragePlugin
    from rosbags.rosbag2 import Writer as BagWriter

    from edgecap.ros.images import bgr_to_compressed, bgr_to_image
    from edgecap.ros.mcap_out import _typestore, msgdef

    store = _typestore()
    period = 33_333_333
    messages = []
    for t, image in camera_frames(args):
        ns = 1_700_000_000_000_000_000 + t * period
        messages.append((ns, bgr_to_image(image, ns, "cam", "rgb8"),
                         bgr_to_compressed(image, ns, "cam", "jpeg")))
    types = {"/camera/image_raw": "sensor_msgs/msg/Image",
             "/camera/compressed": "sensor_msgs/msg/CompressedImage"}

    bare = workdir / "bare.mcap"
    with bare.open("wb") as fh:
        writer = McapWriter(fh)
        schemas = {t: writer.register_msgdef(m, msgdef(m)) for t, m in types.items()}
        for ns, raw, jpeg in messages:
            writer.write_message("/camera/image_raw", schemas["/camera/image_raw"], raw, log_time=ns)
            writer.write_message("/camera/compressed", schemas["/camera/compressed"], jpeg, log_time=ns)
        writer.finish()

    def as_message(typename, fields):
        """rosbags' message object of the same fields, for its own writer."""
        import numpy as np

        t = store.types
        stamp = t["builtin_interfaces/msg/Time"](**fields["header"]["stamp"])
        header = t["std_msgs/msg/Header"](stamp=stamp, frame_id=fields["header"]["frame_id"])
        rest = {k: v for k, v in fields.items() if k not in ("header", "data")}
        return t[typename](header=header, data=np.frombuffer(fields["data"], np.uint8), **rest)

    out = {"mcap file": bare}
    for storage, plugin in (("rosbag2 mcap", StoragePlugin.MCAP),
                            ("rosbag2 sqlite3", StoragePlugin.SQLITE3)):
        path = workdir / storage.replace(" ", "_")
        with BagWriter(path, version=9, storage_plugin=plugin) as writer:
            conns = {t: writer.add_connection(t, m, typestore=store) for t, m in types.items()}
            for ns, raw, jpeg in messages:
                for topic, fields in (("/camera/image_raw", raw), ("/camera/compressed", jpeg)):
                    msg = as_message(types[topic], fields)
                    writer.write(conns[topic], ns, store.serialize_cdr(msg, types[topic]))
        out[storage] = path
    return out


def read_all(log, topic: str, msgtype: str) -> int:
    from edgecap.ros.images import message_to_bgr

    n = 0
    for _, msg in log.messages(topic):
        message_to_bgr(msg, msgtype)
        n += 1
    return n


def readers_for(storage: str, path: Path):
    from edgecap.ros.mcap_log import McapLog
    from edgecap.ros.rosbags_log import RosbagsLog, SqliteLog

    mcaps = [path] if path.suffix == ".mcap" else sorted(path.glob("*.mcap"))
    if not mcaps:
        return {"rosbags": lambda: SqliteLog(path, sorted(path.glob("*.db3"))),
                "rosbags AnyReader": lambda: RosbagsLog(path)}
    return {"mcap": lambda: McapLog(path, mcaps), "rosbags": lambda: RosbagsLog(path)}


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out)
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgecap-logread-") as tmp:
        logs = write_logs(args, Path(tmp))
        for storage, path in logs.items():
            for topic, msgtype in (("/camera/image_raw", "sensor_msgs/msg/Image"),
                                   ("/camera/compressed", "sensor_msgs/msg/CompressedImage")):
                for reader, opener in readers_for(storage, path).items():
                    def run(opener=opener, topic=topic, msgtype=msgtype):
                        with opener() as log:
                            assert read_all(log, topic, msgtype) == args.frames
                    seconds = timed(run, args.repeats, warmup=1)
                    median = statistics.median(seconds)
                    rows.append({"storage": storage, "message": msgtype.rsplit("/", 1)[-1],
                                 "reader": reader, "ms_per_image": 1e3 * median / args.frames,
                                 "images_per_s": args.frames / median})
    for row in rows:
        same = [r for r in rows if r["storage"] == row["storage"] and r["message"] == row["message"]]
        best = min(r["ms_per_image"] for r in same)
        row["vs_fastest"] = row["ms_per_image"] / best
    columns = [("storage", "storage", ""), ("message", "message", ""), ("reader", "reader", ""),
               ("ms_per_image", "ms / image", ".2f"), ("images_per_s", "images / s", ".0f"),
               ("vs_fastest", "x fastest", ".2f")]
    print(f"{args.frames} images of {args.width}x{args.height}, median of {args.repeats}")
    print_table(rows, columns)
    result = {"frames": args.frames, "size": [args.width, args.height], "repeats": args.repeats,
              "rows": rows, "host": host_info(("numpy", "opencv-python-headless", "rosbags",
                                               "mcap", "mcap-ros2-support"))}
    write_json(out_dir / "log_read.json", result)
    from edgecap.io import write_text_atomic

    lines = ["| storage | message | reader | ms / image | images / s | × fastest |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['storage']} | {r['message']} | {r['reader']} | {r['ms_per_image']:.2f} | "
              f"{r['images_per_s']:.0f} | {r['vs_fastest']:.2f} |" for r in rows]
    write_text_atomic(out_dir / "log_read.md", "\n".join(lines) + "\n")
    print(f"wrote {out_dir / 'log_read.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
