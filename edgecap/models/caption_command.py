"""`edgecap caption CHECKPOINT IMAGE...`: one caption per image, decoded in PyTorch."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("checkpoint", help="an edgecap checkpoint (.pt)")
    parser.add_argument("images", nargs="+", help="image files (anything OpenCV reads)")
    parser.add_argument("--beam", type=int, default=3, help="beam size (1 = greedy)")
    parser.add_argument("--max-len", type=int, default=None, help="longest caption in tokens")
    parser.add_argument("--length-penalty", type=float, default=0.0)


def run(args) -> int:
    import cv2
    import numpy as np
    import torch

    from edgecap.errors import EdgecapError
    from edgecap.models.checkpoint import load_checkpoint
    from edgecap.models.decoding import generate
    from edgecap.contract.beam import DecodeOptions
    from edgecap.contract.preprocess import preprocess

    ckpt = load_checkpoint(args.checkpoint)
    model, vc = ckpt.model, ckpt.config.visual
    if not getattr(model.visual, "takes_images", False):
        raise EdgecapError(
            f"checkpoint {args.checkpoint} reads precomputed features (visual.kind={vc.kind!r}), not images"
        )
    for path in args.images:
        image = cv2.imread(path, cv2.IMREAD_COLOR)
        if image is None:
            raise EdgecapError(f"cannot read image {path}")
        x = preprocess(image, vc.image_size, vc.mean, vc.std, vc.resize, vc.channel_order)
        with torch.no_grad():
            feats, mask = model.visual(torch.from_numpy(x[None]))
            options = DecodeOptions(
                beam_size=args.beam,
                max_len=args.max_len or ckpt.config.max_len,
                length_penalty=args.length_penalty,
            )
            hyp = generate(model, feats, mask, options)
        words = ckpt.vocab.decode(np.asarray(hyp.best()[0]))
        print(f"{path}\t{' '.join(words)}")
    return 0
