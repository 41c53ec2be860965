"""Checkpoints round-trip, are written atomically, and bad files get one-line errors.

Weights that are not finite (a diverged or damaged run) are refused in one line naming the
tensor, by `import-m2` and by `export`; an official checkpoint with a 1-D word embedding is a
one-line error, not an IndexError traceback.
"""

import cv2
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgecap.contract.vocab import Vocab  # noqa: E402
from edgecap.errors import EdgecapError  # noqa: E402
from edgecap.models import build  # noqa: E402
from edgecap.models.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from edgecap.models.core import sinusoid_table  # noqa: E402
from edgecap.models.decoding import generate  # noqa: E402
from tests.conftest import tiny_overrides  # noqa: E402
from tests.test_m2_import import ITOS, H, official_state, save_official, save_vocab_pickle  # noqa: E402


def tiny_vocab(n=40):
    return Vocab(["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(n - 4)])


def test_round_trip_gives_identical_captions(tmp_path):
    torch.manual_seed(0)
    model = build("pma-edge", **tiny_overrides("pma-edge")).eval()
    model.layers[0].self_attn.set_prototypes(torch.randn(3, 32), torch.randn(3, 32))
    path = save_checkpoint(tmp_path / "m.pt", model, tiny_vocab(), meta={"step": 7})
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt"]  # no temp file left
    ckpt = load_checkpoint(path)
    assert ckpt.meta == {"step": 7}
    assert int(ckpt.model.layers[0].self_attn.proto_valid.sum()) == 3
    feats, mask = torch.randn(2, 6, 24), torch.ones(2, 6, dtype=torch.bool)
    assert (generate(model, feats, mask).tokens == generate(ckpt.model, feats, mask).tokens).all()


def test_a_position_table_other_than_the_sinusoid_survives_save_and_load(tmp_path):
    """An imported model carries its own decoder table (official M2 checkpoints hold a random
    one); the checkpoint must keep it rather than rebuild the sinusoid on load."""
    torch.manual_seed(0)
    model = build("m2", **tiny_overrides("m2")).eval()
    model.positions.copy_(torch.rand_like(model.positions) - 0.5)
    ckpt = load_checkpoint(save_checkpoint(tmp_path / "m.pt", model, tiny_vocab()))
    assert torch.equal(ckpt.model.positions, model.positions)
    feats, mask = torch.randn(2, 6, 24), torch.ones(2, 6, dtype=torch.bool)
    tokens = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    with torch.no_grad():
        assert torch.equal(ckpt.model(feats, mask, tokens), model(feats, mask, tokens))


def _as_version_1(path):
    """Rewrite a checkpoint as format_version 1 wrote it: no decoder position table stored."""
    payload = torch.load(path, weights_only=True)
    del payload["state_dict"]["positions"]
    payload["format_version"] = 1
    torch.save(payload, path)
    return payload


def test_version_1_checkpoints_load_with_the_sinusoid_they_were_trained_with(tmp_path):
    torch.manual_seed(1)
    model = build("smart", **tiny_overrides("smart")).eval()
    v2 = save_checkpoint(tmp_path / "v2.pt", model, tiny_vocab())
    v1 = save_checkpoint(tmp_path / "v1.pt", model, tiny_vocab())
    _as_version_1(v1)
    feats, mask = torch.randn(3, 6, 24), torch.ones(3, 6, dtype=torch.bool)
    a, b = load_checkpoint(v1).model, load_checkpoint(v2).model
    assert torch.equal(a.positions, sinusoid_table(a.cfg.max_len + 1, a.cfg.d_model, zero_row=0))
    assert (generate(a, feats, mask).tokens == generate(b, feats, mask).tokens).all()
    # From version 2 on the table is part of the weights: a file without it is refused.
    payload = _as_version_1(v2)
    payload["format_version"] = 2
    torch.save(payload, v2)
    with pytest.raises(EdgecapError, match=r"v2.pt is inconsistent: the weights lack tensor positions \(1 missing\)"):
        load_checkpoint(v2)


def test_packaged_demo_checkpoint_captions_as_before_positions_were_stored():
    """demo-smart.pt predates stored tables (format_version 1, no 'positions' key)."""
    from edgecap.export.demo_command import demo_checkpoint
    from edgecap.models.checkpoint import read_payload
    from edgecap.models.factory import build_from_config

    path = demo_checkpoint()
    raw = torch.load(path, weights_only=True)
    if raw["format_version"] != 1:
        pytest.skip("the packaged asset was re-saved with its table; version 1 is covered above")
    assert "positions" not in raw["state_dict"]
    ckpt = load_checkpoint(path)
    # what loading did while the table was a non-persistent buffer: the freshly built sinusoid
    before = build_from_config(ckpt.config).eval()
    before.load_state_dict({k: v.float() for k, v in raw["state_dict"].items()}, strict=False)
    assert torch.equal(ckpt.model.positions, before.positions)
    assert "positions" in read_payload(path)["state_dict"]
    size = ckpt.config.visual.image_size  # the demo reads images through its small CNN
    images = torch.rand(4, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        feats, mask = ckpt.model.visual(images)
    assert (generate(ckpt.model, feats, mask).tokens == generate(before, feats, mask).tokens).all()


def test_half_precision_checkpoint_is_smaller_and_loads_as_float(tmp_path):
    model = build("smart", **tiny_overrides("smart"))
    full = save_checkpoint(tmp_path / "f.pt", model, tiny_vocab())
    half = save_checkpoint(tmp_path / "h.pt", model, tiny_vocab(), half=True)
    assert half.stat().st_size < 0.7 * full.stat().st_size
    assert load_checkpoint(half).model.fc.weight.dtype == torch.float32


def test_missing_corrupt_and_foreign_files_are_refused(tmp_path):
    with pytest.raises(EdgecapError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(EdgecapError, match="bad.pt is not a readable PyTorch file"):
        load_checkpoint(bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"a": torch.zeros(1)}}, foreign)
    with pytest.raises(EdgecapError, match="not an edgecap checkpoint"):
        load_checkpoint(foreign)


def test_caption_command_prints_one_caption_per_image(tmp_path, run_cli):
    over = tiny_overrides("smart")
    over.update(d_in=16, n_regions=4, visual={"kind": "cnn", "image_size": 32, "channels": [8, 16, 16, 16]})
    model = build("smart", **over)
    ckpt = save_checkpoint(tmp_path / "cnn.pt", model, tiny_vocab())
    images = []
    for i in range(2):
        path = tmp_path / f"img{i}.png"
        cv2.imwrite(str(path), np.full((40, 50, 3), 60 * i, np.uint8))
        images.append(path)
    code, out, err = run_cli("caption", ckpt, *images, "--beam", "2")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(p) for p in images]
    assert all(word.startswith("w") or word == "<unk>" for line in lines for word in line.split("\t")[1].split())
    code, _, err = run_cli("caption", ckpt, tmp_path / "missing.png")
    assert code == 1 and "missing.png: no such image file or folder" in err and err.count("\n") == 1


@pytest.fixture
def cnn_checkpoint(tmp_path):
    return cnn_checkpoint_in(tmp_path)


def cnn_checkpoint_in(tmp_path):
    """(a tiny image checkpoint with a 40-word vocabulary, a 40x50 image) in tmp_path."""
    over = tiny_overrides("smart")
    over.update(d_in=16, n_regions=4, max_len=8, visual={"kind": "cnn", "image_size": 32, "channels": [8, 16, 16, 16]})
    ckpt = save_checkpoint(tmp_path / "cnn.pt", build("smart", **over), tiny_vocab())
    image = tmp_path / "img.png"
    cv2.imwrite(str(image), np.full((40, 50, 3), 90, np.uint8))
    return ckpt, image


@pytest.mark.parametrize("argv, message", [
    (["--max-len", "500"], "--max-len 500: expected 2..8"),
    (["--beam", "41"], "--beam 41: expected 1..40 (the model's vocabulary)"),
])
def test_caption_options_that_cannot_decode_are_one_line_errors(cnn_checkpoint, run_cli, argv, message):
    ckpt, image = cnn_checkpoint
    code, out, err = run_cli("caption", ckpt, image, *argv)
    assert (code, out) == (1, "") and err.startswith(f"edgecap caption: error: {message}")
    assert err.count("\n") == 1


def test_caption_a_shorter_max_len_is_honoured(cnn_checkpoint, run_cli):
    ckpt, image = cnn_checkpoint
    code, out, err = run_cli("caption", ckpt, image, "--max-len", "2", "--beam", "1")
    assert code == 0, err
    assert len(out.rstrip("\n").split("\t")[1].split()) <= 2  # an empty caption is "path\t"


def test_caption_of_a_bundle_points_to_edgecap_run(tmp_path, run_cli, cnn_checkpoint):
    _, image = cnn_checkpoint
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text('{"format": "edgecap-bundle"}')
    code, _, err = run_cli("caption", bundle, image)
    assert code == 1 and err.count("\n") == 1
    assert f"{bundle} is an exported bundle, not a checkpoint" in err and f"edgecap run {bundle} --source" in err


def _mixed(tmp_path, weights_from: str, config_from: str, **config_overrides) -> str:
    torch.manual_seed(0)
    weights = build(weights_from, **tiny_overrides(weights_from))
    config = build(config_from, **{**tiny_overrides(config_from), **config_overrides})
    path = save_checkpoint(tmp_path / "mixed.pt", weights, tiny_vocab())
    payload = torch.load(path, weights_only=True)
    torch.save({**payload, "config": config.cfg.to_dict()}, path)
    return path


@pytest.mark.parametrize("command", [["export", "--engine", "onnx"], ["caption"]])
@pytest.mark.parametrize("config_from, overrides, message", [
    ("updown", {}, "the weights lack tensor"),
    ("smart", {"d_model": 64}, "32] in the weights, the model's is ["),
])
def test_a_checkpoint_whose_config_and_weights_disagree_is_named(tmp_path, run_cli, command, config_from, overrides,
                                                                 message):
    path = _mixed(tmp_path, "smart", config_from, **overrides)
    image = tmp_path / "img.png"
    cv2.imwrite(str(image), np.zeros((8, 8, 3), np.uint8))
    extra = ["--out", tmp_path / "b"] if command[0] == "export" else [image]
    code, _, err = run_cli(command[0], path, *command[1:], *extra)
    assert code == 1 and err.count("\n") == 1, err
    assert f"checkpoint {path} is inconsistent" in err and message in err
    assert f"its config ('{config_from}'" in err and "come from different models" in err


# -- weights that are not finite -------------------------------------------------------------------
@pytest.fixture
def vocab(tmp_path):
    path = tmp_path / "vocab.pkl"
    save_vocab_pickle(path, ITOS)
    return path


@pytest.mark.parametrize("value, counts", [(float("nan"), "2 non-finite values (2 NaN, 0 infinite)"),
                                           (float("inf"), "2 non-finite values (0 NaN, 2 infinite)")],
                         ids=["nan", "inf"])
def test_import_m2_refuses_non_finite_weights(tmp_path, vocab, run_cli, value, counts):
    state = official_state()
    state["decoder.layers.1.pwff.fc2.weight"][0, :2] = value
    weights = tmp_path / "diverged.pth"
    save_official(weights, state)
    out = tmp_path / "m2.pt"
    code, _, err = run_cli("import-m2", "--weights", weights, "--vocab", vocab, "--out", out, "--heads", H)
    assert code == 1
    assert err.strip().splitlines() == [
        f"edgecap import-m2: error: M2 checkpoint {weights}: tensor layers.1.ff.fc2.weight holds {counts} "
        f"of {state['decoder.layers.1.pwff.fc2.weight'].numel()}; refusing to import weights that are not finite "
        "(a diverged or damaged training run)"], err
    assert not out.exists()


def test_import_m2_with_a_1d_word_embedding_is_one_line(tmp_path, vocab, run_cli):
    state = official_state()
    state["decoder.word_emb.weight"] = state["decoder.word_emb.weight"][:, 0].clone()
    weights = tmp_path / "flat.pth"
    save_official(weights, state)
    code, _, err = run_cli("import-m2", "--weights", weights, "--vocab", vocab, "--out", tmp_path / "m2.pt")
    assert code == 1
    assert err.strip().splitlines() == [
        f"edgecap import-m2: error: M2 checkpoint: decoder.word_emb.weight has shape [{len(ITOS)}], "
        "expected [vocab, d_model]"]


def test_export_refuses_a_checkpoint_with_non_finite_weights(tmp_path, run_cli):
    from edgecap.models.checkpoint import save_checkpoint
    from tests._export_util import tiny_model, tiny_vocab

    model = tiny_model("smart")
    with torch.no_grad():
        model.state_dict()["word_emb.weight"][3, 1] = float("nan")
    ckpt = save_checkpoint(tmp_path / "nan.pt", model, tiny_vocab(model.cfg.vocab_size), {})
    out = tmp_path / "bundle"
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", out, "--samples", 2, "--quiet")
    assert code == 1
    assert err.strip().splitlines() == [
        f"edgecap export: error: checkpoint {ckpt}: tensor word_emb.weight holds 1 non-finite values (1 NaN, "
        f"0 infinite) of {model.state_dict()['word_emb.weight'].numel()}; a bundle of it would caption nothing "
        "(train again, or export an earlier checkpoint)"]
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
