"""Weights that are not finite (a diverged or damaged run) are refused in one line naming the
tensor, by `import-m2` and by `export`; an official checkpoint with a 1-D word embedding is a
one-line error, not an IndexError traceback."""

import pytest

torch = pytest.importorskip("torch")

from tests.test_m2_import import ITOS, H, official_state, save_official, save_vocab_pickle  # noqa: E402


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
