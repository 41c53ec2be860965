"""The packaged demo model's validation captions as a caption log, for re-scoring coverage.

    python benchmarks/coverage_rescore.py WORLD OUT.jsonl [--split val] [--beam 3]

WORLD is the synthetic world the demo model was trained on (`edgecap data synth --out WORLD
--images 4000 --seed 0 --size 96 --format png`, configs/demo-tabletop.toml). Captions the
split's images with edgecap/assets/demo-smart.pt (PyTorch, as `python -m edgecap.train.demo
--rescore` does) and writes one record per image with its objects (each class at its largest
box area, as the demo's metrics file measures it), the layout `edgecap run --jsonl` writes. Then

    edgecap eval coverage --records OUT.jsonl

scores it; run that with two versions of edgecap to compare their noun extraction on the same
captions (docs/coverage.md, "Old and new extraction").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgecap.argtypes import Integer, Parser  # noqa: E402


def main(argv=None) -> int:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("world", help="the demo's synthetic world (dataset_coco.json, images/, objects.json)")
    ap.add_argument("out", help="caption log to write (JSON Lines)")
    ap.add_argument("--split", default="val")
    ap.add_argument("--beam", type=Integer(1, 10), default=3)
    args = ap.parse_args(argv)

    import torch

    from edgecap.data.karpathy import load_karpathy
    from edgecap.io import write_text_atomic
    from edgecap.jsonio import read_json
    from edgecap.models.checkpoint import load_checkpoint
    from edgecap.train.demo import ASSETS, caption_images, ground_truth

    torch.set_num_threads(1)
    world = Path(args.world)
    images = load_karpathy(world / "dataset_coco.json", world / "images", splits=(args.split,))[args.split]
    objects = read_json(world / "objects.json")
    size = int(read_json(world / "synth.json")["size"])
    ck = load_checkpoint(ASSETS / "demo-smart.pt")
    captions = caption_images(ck, images, world / "images", beam_size=args.beam)
    lines = []
    for im, caption in zip(images, captions, strict=True):
        gt = ground_truth(objects, im.image_id, size)
        lines.append(json.dumps({"source": f"{world.name}/{args.split}", "image_id": im.image_id, "caption": caption,
                                 "objects": [{"class": c, "box": [0, 0, 0, 0], "area": round(a, 6)}
                                             for c, a in sorted(gt.items())]}))
    write_text_atomic(args.out, "\n".join(lines) + "\n")
    print(f"wrote {args.out}: {len(lines)} captions of the {args.split} split (beam {args.beam})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
