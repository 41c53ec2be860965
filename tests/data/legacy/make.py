"""Files written by edgecap before issue 38's refactor (commit c3d6027), which later code must
still read: a PMA run stopped mid-way (its prototype banks in last.state.pt), an RA-T
checkpoint, two bundles (Transformer and RA-T with its retrieval index) and the manifest of a
bundle with a real-size front end. Made once, from that commit:

    PYTHONPATH=$PWD python tests/data/legacy/make.py

and kept as written (tests/test_legacy_files.py reads them). Running it again with later code
would make files of that code, which is not what they are for.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

PMA_MODEL = {"preset": "pma-edge", "d_model": 16, "n_heads": 2, "d_ff": 32, "dropout": 0.1, "max_len": 10,
             "n_regions": 16, "d_in": 16, "encoder_positions": "sinusoidal", "prototype": {"count": 4},
             "visual": {"kind": "cnn", "image_size": 32, "channels": [8, 16, 16]}}
PROTOTYPES = {"bank_iterations": 4, "stride": 4, "topk": 2, "kmeans_iterations": 5, "max_bank": 64}


def pma_run(out: Path) -> None:
    """A tiny PMA run stopped at step 5 (--max-steps): one refresh done, banks half full; the
    synthetic world is generated into the run directory ([data.synth].dir unset) and dropped."""
    from edgecap.train.config import parse_config
    from edgecap.train.loop import Trainer

    cfg = parse_config({"model": PMA_MODEL,
                        "data": {"synth": {"images": 40, "seed": 3, "size": 32}, "batch_size": 4, "min_count": 1,
                                 "val_batch_size": 8},
                        "optim": {"lr": 0.05}, "schedule": {"kind": "noam", "epochs": 2, "warmup": 5},
                        "prototypes": PROTOTYPES, "run": {"log_every": 1, "threads": 1, "seed": 0}},
                       source="pma.toml")
    Trainer(cfg, out=out, max_steps=5, progress=False).run()
    for name in ("data", "curves.png", "best.pt", "summary.json"):
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def rat_checkpoint(path: Path) -> None:
    from _export_util import tiny_vocab

    from edgecap.models import build
    from edgecap.models.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = build("rat", vocab_size=40, d_model=16, n_heads=2, d_ff=32, d_in=24, n_regions=6, max_len=8,
                  retrieval={"k": 3, "length": 5, "index": "index"})
    save_checkpoint(path, model, tiny_vocab(40), {"step": 0})


def bundles(out: Path, tmp: Path) -> None:
    from _export_util import export, save_tiny

    from edgecap.retrieval import CaptionIndex

    export(save_tiny(tmp / "smart.pt", "smart"), out / "bundle-smart")
    g = np.random.default_rng(0)
    captions = [[f"w{i} w{i + 1} w{i + 2}", f"w{i + 3} w{i}"] for i in range(4, 20)]
    CaptionIndex.build(g.standard_normal((16, 24)).astype(np.float32), list(range(16)), captions,
                       kind="flat", k=3).save(tmp / "index")
    export(save_tiny(tmp / "rat.pt", "rat", retrieval={"k": 3, "length": 5, "index": str(tmp / "index")}),
           out / "bundle-rat")


def frontend_manifest(path: Path, tmp: Path) -> None:
    """manifest.json of a captioner trained on features, exported with --frontend (the
    graphs, megabytes of a random mobilenet, are not kept)."""
    from _export_util import export, save_tiny

    from edgecap.models.frontends import build_frontend

    fc = build_frontend("mobilenet_v3_large", 32).cfg
    ckpt = save_tiny(tmp / "feat.pt", "smart", d_in=fc.d_in, n_regions=fc.n_regions)
    export(ckpt, tmp / "fe", frontend="mobilenet_v3_large", image_size=32)
    shutil.copy(tmp / "fe" / "manifest.json", path)


def main() -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pma_run(HERE / "pma-run")
        rat_checkpoint(HERE / "rat.pt")
        bundles(HERE, tmp)
        frontend_manifest(HERE / "manifest-frontend.json", tmp)
    (HERE / "made-by.json").write_text(json.dumps({"commit": commit, "torch": torch.__version__}) + "\n")


if __name__ == "__main__":
    main()
