"""The official M² code itself against `m2-official` (_official_m2.py), on the same weights.

    python benchmarks/official_m2_check.py --code PATH/TO/meshed-memory-transformer \
        [--batch-sizes 1,32] [--beam 5] [--repeats 3] [--threads 2] [--vocab 10201] [--out DIR]

`latency.py`'s "vs official" ratios are taken against `_official_m2.py`, a re-implementation
of the official beam search on edgecap's M² model. This script checks that reference against
the official code (a checkout of aimagelab/meshed-memory-transformer that you provide; nothing
of it is in this repository): it builds the official `Transformer` as its `test.py` does
(memory-augmented encoder with 40 slots, meshed decoder, random weights with a fixed seed),
moves its weights into edgecap's M² model with the M² checkpoint importer, and runs the
official `beam_search` and `m2-official` on the same features in turns. It reports whether the
captions are token-identical and both times (medians after a warm-up).

The official code was written for torch 1.1-1.3. On a current torch it needs two changes,
made on a temporary copy (the checkout is only read): the beam index `selected_idx / V` must
be an integer division, and the self-attention's running mask must start as bool (uint8 masks
are refused by `masked_fill`). Nothing else is changed.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, host_info, summary, timed, write_json  # noqa: E402

from edgecap.argtypes import BATCH, BEAM, COUNT, THREADS, Integer, ListOf, Parser  # noqa: E402

# (file, text in the official code, text that current torch needs)
MODERN_TORCH = (
    ("models/beam_search/beam_search.py", "selected_beam = selected_idx / candidate_logprob.shape[-1]",
     "selected_beam = torch.div(selected_idx, candidate_logprob.shape[-1], rounding_mode='floor')"),
    ("models/transformer/decoders.py", "torch.zeros((1, 1, 0)).byte())", "torch.zeros((1, 1, 0)).bool())"),
)
SPECIALS = ["<unk>", "<pad>", "<bos>", "<eos>"]  # the official vocabulary's first four words
MEMORY_SLOTS, POSITIONS = 40, 54  # as the official test.py builds the model
MAX_LEN = 20


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--code", required=True, help="a checkout of aimagelab/meshed-memory-transformer")
    p.add_argument("--batch-sizes", type=ListOf(BATCH), default=[1, 32])
    p.add_argument("--beam", type=BEAM, default=5)
    p.add_argument("--repeats", type=COUNT, default=3)
    p.add_argument("--threads", type=THREADS, default=2)
    p.add_argument("--vocab", type=Integer(8, 1_000_000), default=10201, help="words of the random model")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "official_m2"))
    return p.parse_args(argv)


def patched_copy(code: Path, into: Path) -> Path:
    """The official `models` and `utils` packages copied into `into`, with MODERN_TORCH applied."""
    from edgecap.errors import EdgecapError

    for package in ("models", "utils"):
        if not (code / package / "__init__.py").is_file():
            raise EdgecapError(f"--code {code}: no {package}/__init__.py; expected a checkout of "
                               "aimagelab/meshed-memory-transformer")
        shutil.copytree(code / package, into / package)
    for name, old, new in MODERN_TORCH:
        path = into / name
        text = path.read_text()
        if text.count(old) != 1:
            raise EdgecapError(f"--code {code}: {name} does not contain {old!r} once; "
                               "expected the official code as released")
        path.write_text(text.replace(old, new))
    return into


def official_model(vocab_size: int):
    """The official Transformer as its test.py builds it, random weights (seed 0), eval mode.

    Layer norms get random gains and biases, as a trained model has: at their initial 1 and 0
    a layer norm's output sums to 0 up to rounding, and the official encoder masks every region
    whose features sum to exactly 0 (its padding rule), so an untrained model would hide
    regions at random."""
    import torch
    from models.transformer import (
        MemoryAugmentedEncoder,
        MeshedDecoder,
        ScaledDotProductAttentionMemory,
        Transformer,
    )

    torch.manual_seed(0)
    encoder = MemoryAugmentedEncoder(3, 0, attention_module=ScaledDotProductAttentionMemory,
                                     attention_module_kwargs={"m": MEMORY_SLOTS})
    decoder = MeshedDecoder(vocab_size, POSITIONS, 3, SPECIALS.index("<pad>"))
    model = Transformer(SPECIALS.index("<bos>"), encoder, decoder).eval()
    with torch.no_grad():
        for norm in (m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)):
            norm.weight.normal_(1.0, 0.1)
            norm.bias.normal_(0.0, 0.1)
    return model


def edgecap_model(official):
    """The official model's weights in edgecap's M² model (the M² checkpoint importer's mapping)."""
    from edgecap.models.factory import build_from_config
    from edgecap.models.m2_import import convert_state_dict, m2_config

    state = official.state_dict()
    vocab_size = state["decoder.word_emb.weight"].shape[0]
    itos = SPECIALS + [f"w{i}" for i in range(vocab_size - len(SPECIALS))]
    cfg = m2_config(state, itos, max_len=MAX_LEN)
    model = build_from_config(cfg)
    model.load_state_dict(convert_state_dict(state, cfg)[0])
    return model.eval()


def compare(official, model, batch: int, beam: int, repeats: int) -> dict:
    import torch
    from _official_m2 import OfficialM2Decoding

    torch.manual_seed(batch)
    feats = torch.randn(batch, model.cfg.n_regions, model.cfg.d_in)
    mask = torch.ones(batch, model.cfg.n_regions, dtype=torch.bool)  # no zero rows: the official mask is all False
    eos = SPECIALS.index("<eos>")
    ours = OfficialM2Decoding(model, beam, MAX_LEN)

    def run_official():
        with torch.no_grad():
            return official.beam_search(feats, MAX_LEN, eos, beam, out_size=1)[0]

    def run_ours():
        ours.encode(feats, mask)
        return ours.decode()

    theirs_tokens, our_tokens = run_official(), run_ours()
    theirs_s, ours_s = [], []
    for _ in range(repeats):  # in turns, so both see the same state of the host
        theirs_s += timed(run_official, 1, 0)
        ours_s += timed(run_ours, 1, 0)
    same = (theirs_tokens == our_tokens).all(dim=1)
    official_ms, ours_ms = summary(theirs_s)["median_ms"] / batch, summary(ours_s)["median_ms"] / batch
    return {"batch": batch, "beam": beam, "captions": batch, "identical_captions": int(same.sum()),
            "official_code_ms_per_image": official_ms, "m2_official_ms_per_image": ours_ms,
            "m2_official_vs_official_code": ours_ms / official_ms}


def markdown(rows: list[dict]) -> str:
    lines = ["| batch | beam | identical captions | official code, ms / image | m2-official, ms / image | m2-official / official code |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['beam']} | {r['identical_captions']} / {r['captions']} | "
                     f"{r['official_code_ms_per_image']:.1f} | {r['m2_official_ms_per_image']:.1f} | "
                     f"{r['m2_official_vs_official_code']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import torch

    from edgecap.errors import EdgecapError
    from edgecap.io import write_text_atomic

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="edgecap-m2code-") as tmp:
        try:
            code = patched_copy(Path(args.code).expanduser(), Path(tmp))
        except EdgecapError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        sys.path.insert(0, str(code))
        official = official_model(args.vocab)
        model = edgecap_model(official)
        rows = []
        for batch in args.batch_sizes:
            print(f"batch {batch}, beam {args.beam} ...", flush=True)
            rows.append(compare(official, model, batch, args.beam, args.repeats))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "official_m2.json", {"host": host_info(), "threads": args.threads, "repeats": args.repeats,
                                          "vocab": args.vocab, "max_len": MAX_LEN, "rows": rows})
    table = markdown(rows)
    write_text_atomic(out / "official_m2.md", table)
    print(table)
    print(f"wrote {out / 'official_m2.json'}, {out / 'official_m2.md'}")
    return 0 if all(r["identical_captions"] == r["captions"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
