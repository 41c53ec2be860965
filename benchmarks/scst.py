"""SCST reward speed: CIDEr-D per batch, edgecap.metrics.ciderd.CiderD vs pycocoevalcap's Cider.

    python benchmarks/scst.py [--images 5000] [--batch 500] [--out benchmarks/results/scst.json]

SCST scores one batch of sampled captions against the same references every step, so the
numbers that matter are per-batch time with a warm reference cache and the one-off corpus
set-up. Captions are drawn from a seeded 300-word vocabulary, 5 references per image.
"""

from __future__ import annotations

import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgecap.argtypes import COUNT, Parser  # noqa: E402


def main(argv=None) -> int:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=COUNT, default=5000)
    ap.add_argument("--batch", type=COUNT, default=500)
    ap.add_argument("--repeats", type=COUNT, default=10)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "scst.json"))
    args = ap.parse_args(argv)

    import numpy as np
    from pycocoevalcap.cider.cider import Cider

    from edgecap.io import write_json_atomic
    from edgecap.metrics.ciderd import CiderD

    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(300)]

    def sent():
        return " ".join(rng.choice(vocab[: rng.choice([30, 300])]) for _ in range(rng.randint(6, 14)))

    corpus = [[sent() for _ in range(5)] for _ in range(args.images)]
    t0 = time.perf_counter()
    scorer = CiderD(corpus)
    setup = time.perf_counter() - t0
    idx = [rng.randrange(args.images) for _ in range(args.batch)]
    cands, refs = [sent() for _ in idx], [corpus[i] for i in idx]
    scorer.score(cands, refs)  # warm the reference cache, as after the first SCST epoch
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        _, ours = scorer.score(cands, refs)
        times.append(time.perf_counter() - t)
    # pycocoevalcap recomputes everything from the refs it is given each call
    t = time.perf_counter()
    Cider().compute_score({i: r for i, r in enumerate(refs)}, {i: [c] for i, c in enumerate(cands)})
    ref_time = time.perf_counter() - t
    row = {"images": args.images, "batch": args.batch, "corpus_setup_s": round(setup, 3),
           "edgecap_batch_ms_p50": round(1000 * float(np.median(times)), 2),
           "edgecap_batch_ms_p90": round(1000 * float(np.percentile(times, 90)), 2),
           "pycocoevalcap_batch_ms": round(1000 * ref_time, 2),
           "python": platform.python_version(), "platform": platform.platform()}
    print(f"CIDEr-D, corpus {args.images} images x 5 refs (set-up {setup:.2f} s), batch {args.batch}")
    print(f"  edgecap CiderD   p50 {row['edgecap_batch_ms_p50']:8.1f} ms  p90 {row['edgecap_batch_ms_p90']:8.1f} ms")
    print(f"  pycocoevalcap        {row['pycocoevalcap_batch_ms']:8.1f} ms (df from the batch refs)")
    write_json_atomic(args.out, row)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
