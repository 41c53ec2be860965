"""RA-Transformer: retrieved captions as an extra encode input, kNN-augmented decoder attention."""

import types

import numpy as np
import pytest
import torch

from edgecap.contract.beam import DecodeOptions
from edgecap.errors import EdgecapError
from edgecap.models import build, preset_config
from edgecap.models.decoding import generate
from tests.conftest import (
    caption_tokens,
    pixel_losses,
    random_batch,
    teacher_forcing_losses,
    world_images,
)

K, LM = 3, 5


def tiny(**extra):
    torch.manual_seed(0)
    over = dict(vocab_size=40, d_model=32, n_heads=4, d_ff=64, d_in=24, n_regions=6, max_len=8,
                dropout=0.1, retrieval={"k": K, "length": LM})
    return build("rat", **{**over, **extra})


def batch(model, b=3, length=8, seed=1):
    feats, mask, tokens, g = random_batch(model, b, length, seed)
    cfg = model.cfg
    memory = torch.randint(4, cfg.vocab_size, (b, K, LM), generator=g)
    memory[:, :, 0] = cfg.bos_id
    memory[:, :, 3:] = cfg.pad_id  # short retrieved captions
    memory[0, 2] = cfg.pad_id  # one neighbour missing
    memory[-1] = cfg.pad_id  # nothing retrieved for the last image
    return feats, mask, tokens, memory


def test_preset_is_the_paper_configuration():
    cfg = preset_config("rat")
    assert (cfg.enc_layers, cfg.dec_layers, cfg.d_model, cfg.n_heads) == (3, 3, 384, 6)
    assert cfg.decoder_self_attention == "knn" and cfg.retrieval.k == 10
    model = tiny()
    assert model.encode_extra_names == ("memory_tokens",)
    assert model.cross_names[-3:] == ("side_k", "side_v", "side_mask")
    gate = model.layers[0].self_attn.gate
    assert float(torch.sigmoid(gate.detach())) == 0.5  # alpha starts at sigmoid(0)


def test_incremental_decoding_equals_full_prefix_with_captions_missing():
    """The family contract (tests/test_family_contract.py) with retrieval's edge cases: short
    captions, a missing neighbour, an image with nothing retrieved."""
    model = tiny().eval()
    feats, mask, tokens, memory = batch(model)
    with torch.no_grad():
        full = model(feats, mask, tokens, memory)
        inc = model.forward_incremental(feats, mask, tokens, memory)
    assert torch.isfinite(full).all()
    torch.testing.assert_close(inc, full, atol=1e-5, rtol=1e-5)


def test_retrieved_captions_change_the_prediction_and_padding_is_ignored():
    model = tiny().eval()
    feats, mask, tokens, memory = batch(model)
    other = memory.clone()
    other[0, :, 1] = (other[0, :, 1] + 7) % 36 + 4
    with torch.no_grad():
        base = model(feats, mask, tokens, memory)
        changed = model(feats, mask, tokens, other)
        # words behind the padding of a retrieved caption are invisible: replace the pad
        # positions' embeddings by changing the memory encoder's pad row
        model.side.word_emb.weight[model.cfg.pad_id] += 1.0
        padded_changed = model(feats, mask, tokens, memory)
    assert not torch.allclose(base[0], changed[0])
    torch.testing.assert_close(base[1:], changed[1:])  # only image 0 retrieved other words
    torch.testing.assert_close(base, padded_changed, atol=1e-5, rtol=1e-5)


def test_an_image_without_retrieved_captions_gets_no_memory_term():
    model = tiny().eval()
    feats, mask, tokens, memory = batch(model)
    with torch.no_grad():
        base = model(feats, mask, tokens, memory)
        for layer in model.layers:
            layer.self_attn.mem_v.bias += 3.0
        moved = model(feats, mask, tokens, memory)
    torch.testing.assert_close(base[2], moved[2])  # row 2 retrieved nothing
    assert not torch.allclose(base[0], moved[0])


def test_training_reaches_the_memory_gate():
    model = tiny().train()
    feats, mask, tokens, memory = batch(model, b=4, length=7)
    teacher_forcing_losses(model, feats, mask, tokens, 1, memory)
    assert model.layers[0].self_attn.gate.grad is not None


def test_missing_or_misshapen_memory_is_a_clear_error():
    model = tiny().eval()
    feats, mask, tokens, memory = batch(model)
    with pytest.raises(EdgecapError, match="1 extra input.*memory_tokens.*got 0"):
        model.encode(feats, mask)
    with pytest.raises(EdgecapError, match=r"memory_tokens have shape \(3, 3, 4\), expected \[B, 3, 5\]"):
        model.encode(feats, mask, memory[..., :4])
    plain = build("transformer", vocab_size=40, d_model=32, n_heads=4, d_ff=64, d_in=24, n_regions=6, max_len=8)
    with pytest.raises(EdgecapError, match="takes 0 extra"):
        plain.encode(feats, mask, memory)


def test_example_inputs_have_the_static_shape():
    model = tiny().eval()
    (example,) = model.encode_extra_example(2)
    assert example.shape == (2, K, LM) and example.dtype == torch.long
    feats, mask, _, _ = batch(model, b=2)
    cross = model.encode(feats, mask, example)
    assert len(cross) == len(model.cross_names) == len(model.cross_batch_axes)
    assert cross[3].shape == (model.cfg.dec_layers, 2, 4, 8, K * LM)  # keys transposed


@pytest.mark.slow
def test_trains_on_the_synthetic_world_with_retrieval(tmp_path, run_cli):
    """The whole torch-side path: synth images -> index built with the model's own (frozen)
    CNN front end -> training memory from the stored neighbours -> loss goes down."""

    from edgecap.contract.vocab import Vocab
    from edgecap.data.karpathy import load_karpathy
    from edgecap.data.synth.dataset import generate_dataset
    from edgecap.models.checkpoint import save_checkpoint
    from edgecap.retrieval import CaptionIndex, RetrievalMemory

    torch.set_num_threads(1)
    world = tmp_path / "synth"
    generate_dataset(world, n_images=48, seed=3, size=64, sequences=0, video_frames=0)
    data = load_karpathy(world / "dataset_coco.json")
    vocab = Vocab.build([c for im in data.train for c in im.captions], min_count=1)
    torch.manual_seed(0)
    model = build("rat", vocab_size=len(vocab), d_model=32, n_heads=4, d_ff=64, d_in=32, n_regions=16,
                  max_len=16, retrieval={"k": 4, "length": 12},
                  visual={"kind": "cnn", "image_size": 64, "channels": [8, 16, 32, 32]})
    save_checkpoint(tmp_path / "init.pt", model, vocab)
    code, out, err = run_cli("index", "build", "--checkpoint", tmp_path / "init.pt", "--images", world / "images",
                             "--split-file", world / "dataset_coco.json", "--out", tmp_path / "index", "-k", "4")
    assert code == 0, err
    assert f"indexed {len(data.train)} images (32-d, flat, inner product)" in out

    index = CaptionIndex.load(tmp_path / "index")
    memory = RetrievalMemory.for_model(index, vocab.stoi, model.cfg)
    items = data.train[:16]
    mem = torch.from_numpy(memory.for_indexed([i.image_id for i in items]))
    assert mem.shape == (16, 4, 12)
    images = torch.from_numpy(world_images(world, items, model.cfg.visual))
    tokens = caption_tokens(items, vocab, model.cfg.max_len)

    for p in model.visual.parameters():  # the retrieval backbone stays as indexed
        p.requires_grad_(False)
    model.train()
    model.visual.eval()
    losses = pixel_losses(model, images, tokens, 30, mem, pad_id=vocab.pad_id)
    assert losses[-1] < 0.5 * losses[0], losses[::5]
    from edgecap.retrieval.command import visual_fingerprint

    assert visual_fingerprint(model) == index.meta["embedding"]["visual_sha256"]


PROBE = r"""
import json, sys
import numpy as np
from edgecap.contract.beam import DecodeOptions
from tests.conftest import random_batch
from edgecap.runtime.session import Bundle
bundle = Bundle.load(sys.argv[1])
images = np.load(sys.argv[2])
feats, mask = bundle.visual(images)
cross = bundle.encode(feats, mask)  # retrieval runs inside: faiss-cpu, no torch
hyp = bundle.decode(cross, DecodeOptions(beam_size=2, max_len=bundle.max_len))
memory = bundle.retriever(feats, mask)
print(json.dumps({"tokens": hyp.tokens[:, 0].tolist(), "memory": memory.tolist(),
                  "torch": "torch" in sys.modules, "retrieval_ms": bundle.retriever.last_ms}))
"""


@pytest.mark.slow
def test_bundle_carries_the_index_and_captions_like_pytorch_without_torch(tmp_path, run_cli, monkeypatch):
    import json
    import subprocess
    import sys

    from edgecap.contract.vocab import Vocab
    from edgecap.data.karpathy import load_karpathy
    from edgecap.data.synth.dataset import generate_dataset
    from edgecap.models.checkpoint import save_checkpoint
    from edgecap.retrieval import CaptionIndex, RetrievalMemory, image_embeddings

    torch.set_num_threads(1)
    world = tmp_path / "synth"
    generate_dataset(world, n_images=40, seed=4, size=64, sequences=0, video_frames=0, progress=False)
    data = load_karpathy(world / "dataset_coco.json")
    vocab = Vocab.build([c for im in data.train for c in im.captions], min_count=1)
    shape = dict(vocab_size=len(vocab), d_model=32, n_heads=4, d_ff=64, d_in=32, n_regions=16, max_len=12,
                 visual={"kind": "cnn", "image_size": 64, "channels": [8, 16, 32, 32]})
    torch.manual_seed(0)
    model = build("rat", **shape, retrieval={"k": 3, "length": 8, "index": str(tmp_path / "index")}).eval()
    save_checkpoint(tmp_path / "rat.pt", model, vocab)
    assert run_cli("index", "build", "--checkpoint", tmp_path / "rat.pt", "--images", world / "images",
                   "--split-file", world / "dataset_coco.json", "--out", tmp_path / "index", "-k", "3")[0] == 0
    code, out, err = run_cli("export", tmp_path / "rat.pt", "--engine", "onnx", "--batch", "2", "--beam", "2",
                             "--out", tmp_path / "bundle")
    assert code == 0, err
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["parity"]["onnxruntime"]["passed"]
    assert manifest["retrieval"]["k"] == 3 and manifest["retrieval"]["count"] == len(data.train)
    assert manifest["state"]["encode_extra_names"] == ["memory_tokens"]

    images = world_images(world, data.test[:2], model.cfg.visual)
    np.save(tmp_path / "images.npy", images)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "bundle"), str(tmp_path / "images.npy")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["torch"] is False and report["retrieval_ms"] > 0

    with torch.no_grad():
        feats, mask = model.visual(torch.from_numpy(images))
    index = CaptionIndex.load(tmp_path / "index")
    memory = RetrievalMemory.for_model(index, vocab.stoi, model.cfg).for_embeddings(
        image_embeddings(feats.numpy(), mask.numpy()))
    assert report["memory"] == memory.tolist()
    hyp = generate(model, feats, mask, DecodeOptions(beam_size=2, max_len=model.cfg.max_len),
                   extra=(torch.from_numpy(memory),))
    assert report["tokens"] == hyp.tokens[:, 0].tolist()

    # rebuilding the TensorRT engines on the robot keeps the retrieval assets (engines faked:
    # no GPU here; what is checked is the bundle the rebuild writes around them)
    import edgecap.export.rebuild as rebuild
    import edgecap.export.tensorrt as tensorrt
    from edgecap.export.formats import resolve_settings
    from edgecap.runtime.session import Bundle

    def fake_engine(onnx_path, engine_path, *args, **kwargs):
        engine_path.write_bytes(onnx_path.read_bytes())
        return {"version": "10.0", "gpu": "test", "compute_capability": "8.7", "workspace_mb": 1, "int8_mode": ""}

    monkeypatch.setattr(tensorrt, "build_engine", fake_engine)
    monkeypatch.setattr(tensorrt, "parser_problems", lambda *a: [])  # the stand-in has no parser
    fake_trt = types.ModuleType("tensorrt")  # importable, a supported release, never called
    fake_trt.__version__ = "10.3.0"
    monkeypatch.setitem(sys.modules, "tensorrt", fake_trt)
    monkeypatch.setattr(rebuild, "compare_engines", lambda *a: {  # the report's shape, as compare_engines writes it
        "precision": "fp32", "inputs": "random inputs (engines vs the bundle's onnxruntime graphs)", "samples": 2,
        "beam_identical": 1.0, "encoder_max_abs_delta": 0.0, "passed": True})
    rebuilt = tmp_path / "rebuilt"
    rebuild.rebuild_engines(tmp_path / "bundle", resolve_settings({"engine": "trt", "out": str(rebuilt)}))
    assert (rebuilt / "retrieval" / "memory_tokens.npy").is_file()
    assert Bundle.load(rebuilt, engine="onnxruntime").retriever is not None

    # a tampered token table is refused like a tampered graph

    table = tmp_path / "bundle" / "retrieval" / "memory_tokens.npy"
    np.save(table, np.zeros((len(data.train), 8), np.int64))
    with pytest.raises(EdgecapError, match="memory_tokens.npy has sha256"):
        Bundle.load(tmp_path / "bundle")

    # an index built with another visual front end is refused at export
    torch.manual_seed(1)
    other = build("rat", **shape, retrieval={"k": 3, "length": 8, "index": str(tmp_path / "index")})
    save_checkpoint(tmp_path / "other.pt", other, vocab)
    code, _, err = run_cli("export", tmp_path / "other.pt", "--engine", "onnx", "--out", tmp_path / "b2")
    assert code == 1 and "different visual front end" in err
