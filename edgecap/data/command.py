"""`edgecap data ...`: generate the synthetic tabletop world (and its contact sheet)."""

from __future__ import annotations

import argparse

from edgecap.argtypes import (
    FRAME_COUNT,
    IMAGE_SIDE,
    SEED,
    SEQUENCE_FRAMES,
    SHEET_GRID,
    SHEET_TILE,
    SYNTH_IMAGES,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    synth = sub.add_parser("synth", help="write the synthetic tabletop dataset (Karpathy json, "
                                         "ACVR sequences, mp4)")
    synth.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    synth.add_argument("--images", type=SYNTH_IMAGES, required=True, help="number of Karpathy images")
    synth.add_argument("--seed", type=SEED, default=0, help="random seed (default 0)")
    synth.add_argument("--size", type=IMAGE_SIDE, default=128, help="image side in pixels (default 128)")
    synth.add_argument("--sequences", type=FRAME_COUNT, default=2, help="ACVR sequences (default 2)")
    synth.add_argument("--frames-per-sequence", type=SEQUENCE_FRAMES, default=20,
                       help="frames per ACVR sequence (default 20)")
    synth.add_argument("--video-frames", type=FRAME_COUNT, default=150,
                       help="frames of video/tabletop.mp4 at 15 fps, 0 for none (default 150)")
    synth.add_argument("--video-size", type=IMAGE_SIDE, default=None,
                       help="video frame side in pixels (default: --size)")
    synth.add_argument("--format", dest="image_format", choices=("jpg", "png"), default="jpg",
                       help="Karpathy image format (default jpg, as COCO)")
    synth.add_argument("--mcap", action="store_true",
                       help="also write the video clip as a ROS 2 log, video/tabletop.mcap "
                            "(/camera/image_raw, /camera/camera_info; needs edgecap[ros])")
    synth.add_argument("--force", action="store_true", help="replace a non-empty --out")
    synth.add_argument("--quiet", action="store_true", help="no progress bar (there is none when stderr is not a terminal)")
    sheet = sub.add_parser("sheet", help="render a contact sheet of example scenes with captions")
    sheet.add_argument("--out", required=True, help="PNG file to write")
    sheet.add_argument("--seed", type=SEED, default=0, help="random seed of the scenes (default 0)")
    sheet.add_argument("--grid", type=SHEET_GRID, default=4, help="tiles per side (default 4)")
    sheet.add_argument("--size", type=SHEET_TILE, default=128, help="rendered tile size (default 128)")


def run(args: argparse.Namespace) -> int:
    if args.action == "synth":
        from edgecap.data.synth import generate_dataset

        summary = generate_dataset(args.out, args.images, seed=args.seed, size=args.size,
                                   sequences=args.sequences,
                                   frames_per_sequence=args.frames_per_sequence,
                                   video_frames=args.video_frames, video_size=args.video_size,
                                   image_format=args.image_format, force=args.force,
                                   progress=not args.quiet, mcap=args.mcap)
        print(f"wrote {summary['images']} images, {summary['sequences']} ACVR sequences x "
              f"{summary['frames_per_sequence']} frames, {summary['video_frames']} video frames "
              f"to {summary['out']}")
        if summary["mcap"]:
            print(f"robot log: {summary['mcap']}")
        return 0
    from edgecap.data.synth.sheet import contact_sheet

    path = contact_sheet(args.out, seed=args.seed, grid=args.grid, size=args.size)
    print(f"wrote {path}")
    return 0
