"""RA-Transformer and ACF through `edgecap train`: retrieval index built into the run, memory
tokens in XE / SCST / validation, export of the trained RA-T with its index, exact resume."""

import copy
import json

import numpy as np
import pytest
import torch
from _train_tiny import TINY_MODEL, run_ddp, tiny_config
from conftest import world_images

from edgecap.errors import EdgecapError
from edgecap.train.config import to_toml
from edgecap.train.loop import Trainer

TINY_RAT = {**copy.deepcopy(TINY_MODEL), "preset": "rat", "retrieval": {"k": 3, "length": 8}}
TINY_RAT.pop("memory")
# 32 px through three stride-2 blocks: a 4x4 grid, 2x pooled for the 2-D clustering
TINY_ACF = {**copy.deepcopy(TINY_MODEL), "preset": "acf", "enc_layers": 2, "dec_layers": 2,
            "clustering": {"grid_w": 4, "downsample": 2}}
TINY_ACF.pop("memory")
SCST = {"epochs": 1, "beam_size": 3, "lr": 1e-3}
# The tiny RA-T (frozen random CNN) needs ~70 steps to leave the "a a a ..." plateau: before
# that every SCST reward is 0 and SCST would be a no-op.
RAT_XE = {"schedule": {"epochs": 8, "warmup": 10}, "optim": {"lr": 0.1}}


def records(run, kind="train"):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def losses(run):
    return [(r["step"], r["phase"], r["loss"]) for r in records(run)]


def falls(run):
    xe = [loss for _, phase, loss in losses(run) if phase == "xe"]
    return np.mean(xe[-3:]) < 0.8 * np.mean(xe[:3]), xe


def weights(run, name="last.pt"):
    return torch.load(run / name, weights_only=True)["state_dict"]


@pytest.mark.slow
def test_rat_trains_from_the_cli_with_its_index_and_exports_a_bundle_that_captions_like_pytorch(
        world, tmp_path, run_cli):
    from _export_util import export

    from edgecap.contract.beam import DecodeOptions
    from edgecap.data.karpathy import load_karpathy
    from edgecap.models.checkpoint import load_checkpoint
    from edgecap.models.decoding import generate
    from edgecap.retrieval import CaptionIndex
    from edgecap.retrieval.command import visual_fingerprint
    from edgecap.runtime.session import Bundle
    from edgecap.train.retrieval import TrainingRetrieval

    torch.set_num_threads(1)
    config = tmp_path / "rat.toml"
    config.write_text(to_toml(tiny_config(world, model=TINY_RAT, scst=SCST, **RAT_XE).to_dict()))
    run = tmp_path / "run"
    code, out, err = run_cli("train", "--config", config, "--out", run, "--quiet")
    assert code == 0, err
    ok, xe = falls(run)
    assert ok, xe
    scst = [r for r in records(run) if r["phase"] == "scst"]
    assert scst and any(r["reward"] > 0 for r in scst)  # SCST learnt something: its rewards are not all 0

    # the index over the training split, made by the run's frozen front end, is the checkpoint's
    ckpt = load_checkpoint(run / "best.pt")
    assert ckpt.config.retrieval.index == str((run / "index").resolve())
    index = CaptionIndex.load(run / "index")
    splits = load_karpathy(world / "dataset_coco.json", world / "images")
    assert index.image_ids == [im.image_id for im in splits.train]
    assert index.meta["embedding"]["visual_sha256"] == visual_fingerprint(ckpt.model)
    # SCST moved the captioner, never the front end (weights and BatchNorm statistics)
    xe_weights, final = weights(run, "best_xe.pt"), weights(run, "last.pt")
    changed = [k for k in final if not torch.equal(xe_weights[k], final[k])]
    assert changed and not any(k.startswith("visual.") for k in changed)

    bundle_dir = export(run / "best.pt", tmp_path / "bundle").path
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    assert manifest["parity"]["onnxruntime"]["passed"]
    assert manifest["retrieval"]["count"] == len(splits.train)

    # on the robot: visual graph -> retrieval inside the bundle -> encoder -> beam search
    images = world_images(world, splits.val[:2], ckpt.config.visual)
    bundle = Bundle.load(bundle_dir)
    feats, mask = bundle.visual(images)
    hyp = bundle.decode(bundle.encode(feats, mask), DecodeOptions(beam_size=2, max_len=bundle.max_len))

    # in PyTorch: what validation during training does
    model = ckpt.model.eval()
    with torch.no_grad():
        tfeats, tmask = model.visual(torch.from_numpy(images))
        (memory,) = TrainingRetrieval(run / "index", ckpt.vocab, ckpt.config).for_features(tfeats, tmask)
        want = generate(model, tfeats, tmask, DecodeOptions(beam_size=2, max_len=model.cfg.max_len), extra=(memory,))
    assert np.array_equal(bundle.retriever(feats, mask), memory.numpy())
    assert (memory != ckpt.config.pad_id).any()
    assert hyp.tokens[:, 0].tolist() == want.tokens[:, 0].tolist()


def test_acf_trains_through_the_training_loop(world, tmp_path):
    torch.set_num_threads(1)
    cfg = tiny_config(world, model=TINY_ACF, schedule={"epochs": 3}, scst=SCST)
    summary = Trainer(cfg, out=tmp_path / "run", progress=False).run()
    assert summary["done"] and summary["model"] == "acf"
    ok, xe = falls(tmp_path / "run")
    assert ok, xe
    assert [r["phase"] for r in records(tmp_path / "run", "val")] == ["xe"] * 3 + ["scst"]


@pytest.mark.slow
def test_rat_resume_reproduces_the_uninterrupted_run_and_reuses_the_index(world, tmp_path):
    # retrieval picks a random caption of each neighbour, dropout and a stop mid-epoch and
    # across the SCST switch: everything must come back exactly
    torch.set_num_threads(1)
    cfg = tiny_config(world, model=TINY_RAT, scst=SCST, data={"val_batch_size": 4}, **RAT_XE)
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(cfg, out=straight, progress=False).run()
    Trainer(cfg, out=split, max_steps=40, progress=False).run()  # 4 epochs of 9 steps and 4 more
    built = (split / "index" / "index.faiss").stat().st_mtime_ns
    Trainer(cfg, out=split, resume=True, max_steps=75, progress=False).run()  # 3 SCST steps in
    Trainer(cfg, out=split, resume=True, progress=False).run()
    assert (split / "index" / "index.faiss").stat().st_mtime_ns == built
    got, want = losses(split), losses(straight)
    assert [p for _, p, _ in want].count("scst") == 9
    assert any(r["reward"] > 0 for r in records(straight) if r["phase"] == "scst")
    assert got == want
    a, b = weights(straight), weights(split)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_training_memory_never_holds_the_image_itself_and_is_reproducible(world, tmp_path):
    from edgecap.data.datasets import CaptionDataset, ImageSource

    torch.set_num_threads(1)
    cfg = tiny_config(world, model=TINY_RAT, schedule={"epochs": 1})
    trainer = Trainer(cfg, out=tmp_path / "run", progress=False)
    trainer.setup()
    (hook,) = trainer.hooks  # RA-T's one training hook: its index and retrieved captions
    assert hook.name == "retrieval"
    memory = hook.retrieval.memory
    ds: CaptionDataset = trainer.train_set
    assert isinstance(ds.source, ImageSource)
    (tokens,) = ds[0]["extra"]
    assert tokens.shape == (3, 8) and tokens.dtype == torch.long
    # each retrieved caption is one of the captions of a stored neighbour, never of the image itself
    self_row = memory.index.rows_of([ds.images[0].image_id])[0]
    neighbours = memory.index.neighbours[self_row, :3]
    assert self_row not in neighbours.tolist() and (neighbours >= 0).all()
    table, _ = memory._all_captions()
    for slot, row in enumerate(neighbours):
        assert any(np.array_equal(tokens[slot].numpy(), c) for c in table[row])
    again = ds[0]["extra"][0]
    assert torch.equal(tokens, again)  # same (seed, epoch, index): same picks
    picks = []
    for epoch in range(6):
        ds.set_epoch(epoch)
        picks.append(ds[0]["extra"][0])
    assert any(not torch.equal(picks[0], p) for p in picks[1:])  # other epochs pick other captions


def test_visual_from_copies_the_front_end_and_bad_retrieval_settings_are_one_line_errors(world, tmp_path):
    from edgecap.models.checkpoint import read_payload

    torch.set_num_threads(1)
    smart = Trainer(tiny_config(world, schedule={"epochs": 1}), out=tmp_path / "smart", progress=False)
    smart.run()
    cfg = tiny_config(world, model=TINY_RAT, schedule={"epochs": 1},
                      retrieval={"visual_from": str(tmp_path / "smart" / "best.pt")})
    Trainer(cfg, out=tmp_path / "rat", max_steps=2, progress=False).run()
    theirs, mine = read_payload(tmp_path / "smart" / "best.pt")["state_dict"], weights(tmp_path / "rat")
    assert all(torch.equal(theirs[k].float(), mine[k]) for k in mine if k.startswith("visual."))

    # an index made by another front end (here: the run's own seeded init) is refused
    other = tiny_config(world, model=TINY_RAT, schedule={"epochs": 1},
                        retrieval={"index": str(tmp_path / "rat" / "index")})
    with pytest.raises(EdgecapError, match="built with a different visual front end"):
        Trainer(other, out=tmp_path / "other", progress=False).run()
    wide = {**TINY_RAT, "d_in": 24, "visual": {"kind": "cnn", "image_size": 32, "channels": [8, 16, 24]}}
    bad = tiny_config(world, model=wide, schedule={"epochs": 1},
                      retrieval={"visual_from": str(tmp_path / "smart" / "best.pt")})
    with pytest.raises(EdgecapError, match=r"visual\.body\.\d+\.weight has shape .* the model's is"):
        Trainer(bad, out=tmp_path / "bad", progress=False).run()
    with pytest.raises(EdgecapError, match=r"\[retrieval\] is set but preset 'smart' retrieves nothing"):
        tiny_config(world, retrieval={"visual_from": "x.pt"})
    with pytest.raises(EdgecapError, match=r"\[model\]\.retrieval\.index is set by the trainer"):
        tiny_config(world, model={**TINY_RAT, "retrieval": {"k": 3, "length": 8, "index": "somewhere"}})


def test_rat_from_hdf5_features_indexes_the_features(world, tmp_path):
    import h5py
    from conftest import tiny_overrides

    from edgecap.retrieval import CaptionIndex, image_embeddings

    torch.set_num_threads(1)
    images = json.loads((world / "dataset_coco.json").read_text())["images"]
    rng = np.random.default_rng(0)
    stored = {}
    with h5py.File(tmp_path / "feats.h5", "w") as h5:
        for im in images:
            stored[str(im["cocoid"])] = rng.normal(size=(int(rng.integers(3, 7)), 24)).astype(np.float32)
            h5[f"{im['cocoid']}_features"] = stored[str(im["cocoid"])]
    over = {k: v for k, v in tiny_overrides("rat").items() if k != "vocab_size"}
    cfg = tiny_config(world, model={"preset": "rat", **over, "retrieval": {"k": 3, "length": 8}},
                      schedule={"epochs": 1})
    cfg.data.synth = None
    cfg.data.karpathy, cfg.data.features = str(world / "dataset_coco.json"), str(tmp_path / "feats.h5")
    summary = Trainer(cfg, out=tmp_path / "run", progress=False).run()
    assert summary["done"]
    index = CaptionIndex.load(tmp_path / "run" / "index")
    assert index.meta["embedding"]["source"] == "features"
    first = index.image_ids[0]
    (emb,) = image_embeddings(stored[first][None])
    rows, _ = index.search(emb[None], 1)
    assert index.image_ids[int(rows[0, 0])] == first  # its own features find it first


@pytest.mark.slow
def test_rat_two_process_gloo_run(world, tmp_path):
    cfg = tiny_config(world, model=TINY_RAT, schedule={"epochs": 1, "warmup": 5},
                      scst={"epochs": 1, "beam_size": 2, "lr": 1e-4}, data={"val_batch_size": 4})
    out, _ = run_ddp(tmp_path, cfg)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["done"] and summary["step"] == 10
    assert (out / "index" / "index.faiss").is_file()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
