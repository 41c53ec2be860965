"""`edgecap fleet BUNDLE LOGS... --out DIR`: caption a fleet's robot logs on a Ray cluster.

    edgecap fleet bundles/demo /data/fleet --out captions/           # a local Ray cluster
    edgecap fleet bundles/demo /data/fleet --out captions/ -a        # every image topic
    edgecap fleet bundles/demo /data/fleet --out captions/ --address auto   # after `ray start`

Resumable: run the same command again after a kill (or a failure) and it captions only the
logs that are not finished. docs/fleet.md has the rest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edgecap.argtypes import BEAM, THREADS, Integer, Number
from edgecap.contract.objects import AREAS
from edgecap.errors import EdgecapError

from .job import FleetOptions, run_fleet

ACTORS = Integer(1, 100_000)
ACTOR_CPUS = Number(above=0, high=1024)
LOCAL_CPUS = Integer(1, 4096)
STORE_MB = Integer(80, 1 << 22)          # Ray refuses an object store under 75 MiB


def add_arguments(parser) -> None:
    parser.add_argument("bundle", help="an exported bundle directory (edgecap export), readable at this path on "
                                       "every node of the cluster")
    parser.add_argument("logs", nargs="+", metavar="LOGS",
                        help="robot logs (rosbag2 directories, .mcap, .db3, ROS 1 .bag), videos, image folders, or "
                             "folders searched for logs and videos; readable at these paths on every node")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder: captions/<log>/<topic>.mcap, dataset/<log>.parquet, summary.json "
                             "(a new or empty folder, or one an earlier run of the same job left: it is resumed)")
    parser.add_argument("--topic", action="append", default=None, metavar="TOPIC",
                        help="robot logs: an image topic to caption (repeat for several); default: the log's only "
                             "image topic")
    parser.add_argument("-a", "--all-topics", action="store_true",
                        help="robot logs: caption every image topic (sensor_msgs/Image and CompressedImage)")
    parser.add_argument("--address", default=None,
                        help="join a running Ray cluster: 'auto' (the one `ray start` started on this machine) or "
                             "HOST:PORT; default: start a local cluster for this job")
    parser.add_argument("--actors", type=ACTORS, default=None, metavar="N",
                        help="caption actors (default: one per GPU for GPU bundles, one per --threads CPUs otherwise)")
    parser.add_argument("--actor-cpus", type=ACTOR_CPUS, default=None, metavar="F",
                        help="CPUs each actor reserves in Ray (default: 1 with a GPU, else half a CPU per --threads, "
                             "so the read tasks always find room)")
    parser.add_argument("--threads", type=THREADS, default=1, metavar="N",
                        help="onnxruntime intra-op threads per actor (default 1: the actors are the parallelism)")
    parser.add_argument("--providers", default=None,
                        help="onnxruntime execution providers per actor, comma-separated; CUDA or TensorRT gives "
                             "each actor a GPU (default: the CPU provider, or the bundle's TensorRT engines)")
    parser.add_argument("--beam", type=BEAM, default=None, help="beam size, 1..the bundle's (default: the bundle's)")
    parser.add_argument("--detections", default=None, metavar="DIR",
                        help="a folder of detection files, one per log named after it (robot1/run1.mcap -> "
                             "DIR/robot1/run1.jsonl; DIR/robot1/run1.<topic>.jsonl per topic): edgecap's JSON Lines "
                             "or COCO results; coverage is scored where a log has one")
    parser.add_argument("--categories", default=None, metavar="FILE",
                        help="COCO results in --detections: the class names (a COCO annotation file or a YOLO "
                             "data.yaml; default COCO's 80)")
    parser.add_argument("--area", choices=AREAS, default="box",
                        help="an object's coverage area: its box (default) or its mask pixels")
    parser.add_argument("--coverage", action=argparse.BooleanOptionalAction, default=True,
                        help="score object coverage where objects are known (default on)")
    parser.add_argument("--num-cpus", type=LOCAL_CPUS, default=None, metavar="N",
                        help="the local cluster's CPUs (default: this machine's); not with --address")
    parser.add_argument("--object-store-mb", type=STORE_MB, default=None, metavar="MB",
                        help="the local cluster's object store (default: Ray's, 30%% of memory); not with --address")
    parser.add_argument("--quiet", action="store_true", help="no progress, summary only")


def options_from_args(args):
    if args.all_topics and args.topic:
        raise EdgecapError("--topic and --all-topics both choose topics; give one of them")
    if args.categories and not args.detections:
        raise EdgecapError("--categories applies to COCO results in --detections; no --detections was given")
    if args.detections is not None:
        if not Path(args.detections).expanduser().is_dir():
            raise EdgecapError(f"--detections {args.detections}: not a folder; expected a folder of per-log detection "
                               "files (docs/fleet.md)")
    providers = None
    if args.providers is not None:
        providers = [p.strip() for p in args.providers.split(",") if p.strip()]
        if not providers:
            raise EdgecapError("--providers is empty: name at least one onnxruntime execution provider")
    return FleetOptions(bundle=args.bundle, logs=list(args.logs), out=args.out, topics=tuple(args.topic or ()),
                        all_topics=args.all_topics, address=args.address, actors=args.actors,
                        actor_cpus=args.actor_cpus, threads=args.threads, providers=providers, beam=args.beam,
                        detections=None if args.detections is None else str(args.detections),
                        categories=args.categories, area=args.area, coverage=args.coverage,
                        num_cpus=args.num_cpus, object_store_mb=args.object_store_mb, quiet=args.quiet)


def run(args) -> int:
    run_fleet(options_from_args(args))
    return 0
