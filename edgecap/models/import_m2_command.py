"""`edgecap import-m2`: convert an official M2 Transformer checkpoint into an edgecap checkpoint.

    edgecap import-m2 --weights meshed_memory_transformer.pth --vocab vocab.pkl --out m2.pt
"""

from __future__ import annotations

from edgecap.argtypes import COUNT, Integer
from edgecap.models.checkpoint import check_checkpoint_out, save_checkpoint
from edgecap.models.m2_import import import_m2


def add_arguments(parser) -> None:
    parser.add_argument("--weights", required=True, help="official checkpoint (meshed_memory_transformer.pth)")
    parser.add_argument("--vocab", required=True, help="its vocabulary: vocab.pkl, a JSON itos list, or a .txt (one token a line)")
    parser.add_argument("--out", required=True, help="edgecap checkpoint to write (.pt)")
    parser.add_argument("--heads", type=COUNT, default=8, help="attention heads the model was trained with (default 8, as the paper)")
    parser.add_argument("--max-len", type=Integer(2), default=20, help="longest caption in tokens incl. EOS (static cache length; default 20 as M2's test.py)")
    parser.add_argument("--regions", type=Integer(1, 4096), default=50, help="regions per image (default 50 as M2's test.py)")
    parser.add_argument("--half", action="store_true", help="store weights as fp16")


def run(args) -> int:
    check_checkpoint_out(args.out)
    model, vocab, meta = import_m2(
        args.weights, args.vocab, n_heads=args.heads, max_len=args.max_len, n_regions=args.regions
    )
    save_checkpoint(args.out, model, vocab, meta, half=args.half)
    cfg = model.cfg
    print(
        f"{args.out}: m2 {cfg.enc_layers}+{cfg.dec_layers} layers, d={cfg.d_model}, {cfg.n_heads} heads, "
        f"{cfg.memory.slots} memory slots, {len(vocab)} words, {model.num_parameters() / 1e6:.1f}M parameters, "
        f"{meta['position_table']} position table kept; feed {cfg.n_regions} zero-padded regions with an all-True mask to match the official model"
    )
    return 0
