"""COCO caption metrics through pycocoevalcap, offline (Java for the PTB tokenizer)."""

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("pycocoevalcap")
if shutil.which("java") is None:
    pytest.skip("java is needed by the PTB tokenizer", allow_module_level=True)

from edgecap.errors import EdgecapError  # noqa: E402
from edgecap.metrics import coco  # noqa: E402
from edgecap.metrics.ciderd import CiderD  # noqa: E402

DATASET = {"images": [
    {"cocoid": 11, "filename": "a.jpg", "split": "test", "sentences": [
        {"raw": "A cup on a wooden table."}, {"raw": "A red mug sits on the table"}]},
    {"cocoid": 12, "filename": "b.jpg", "split": "test", "sentences": [
        {"raw": "A laptop next to a book."}, {"tokens": ["an", "open", "laptop", "and", "a", "book"]}]},
    {"cocoid": 13, "filename": "c.jpg", "split": "test", "sentences": [{"raw": "Two chairs in a room"}]},
    {"cocoid": 14, "filename": "d.jpg", "split": "train", "sentences": [{"raw": "a dog"}]},
    {"cocoid": 15, "filename": "e.jpg", "split": "restval", "sentences": [{"raw": "a cat"}]},
]}


@pytest.fixture
def refs_file(tmp_path):
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(DATASET))
    return path


def test_reference_loading_and_id_resolution(refs_file):
    refs, resolve = coco.load_references(refs_file, "test")
    assert set(refs) == {"11", "12", "13"}
    assert refs["12"][1] == "an open laptop and a book"
    assert resolve("b.jpg") == "12" and resolve("c") == "13" and resolve(11) == "11"
    with pytest.raises(EdgecapError, match="no images in split 'val'; splits present: restval, test, train"):
        coco.load_references(refs_file, "val")
    # Karpathy train is train + restval (113k images on COCO), as training reads it
    assert set(coco.load_references(refs_file, "train")[0]) == {"14", "15"}
    assert set(coco.load_references(refs_file, "restval")[0]) == {"15"}


def test_metrics_per_image_and_cider_matches_our_scorer(refs_file):
    refs, _ = coco.load_references(refs_file, "test")
    preds = {"11": "A cup on a wooden table.", "12": "a laptop near a book", "13": ""}
    out = coco.evaluate(preds, refs, meteor=False)
    assert out["n_images"] == 3
    assert set(out["overall"]) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D"}
    assert out["per_image"]["11"]["BLEU-1"] == pytest.approx(1.0, abs=1e-6)
    assert out["per_image"]["11"]["ROUGE-L"] == pytest.approx(1.0)
    assert out["per_image"]["13"]["CIDEr-D"] == 0.0
    assert out["per_image"]["11"]["CIDEr-D"] > out["per_image"]["12"]["CIDEr-D"] > 0
    # our numpy CIDEr-D on the same PTB-tokenised text gives the same per-image numbers
    gts = coco.tokenize({k: refs[k] for k in preds})
    res = coco.tokenize({k: [v] for k, v in preds.items()})
    keys = list(preds)
    _, ours = CiderD([gts[k] for k in keys]).score([res[k][0] for k in keys], [gts[k] for k in keys])
    np.testing.assert_allclose(ours, [out["per_image"][k]["CIDEr-D"] for k in keys], rtol=1e-9)


def test_spice_reported_unavailable_offline(refs_file, monkeypatch):
    refs, _ = coco.load_references(refs_file, "test")
    monkeypatch.setattr(coco, "spice_status", lambda: "SPICE needs stanford-corenlp-3.6.0.jar; offline")
    out = coco.evaluate({"11": "a cup"}, refs, meteor=False, spice=True)
    assert "SPICE" not in out["overall"]
    assert "offline" in out["unavailable"]["SPICE"]


def test_no_overlap_is_an_error(refs_file):
    refs, _ = coco.load_references(refs_file, "test")
    with pytest.raises(EdgecapError, match="no prediction matches"):
        coco.evaluate({"99": "a cup"}, refs, meteor=False)


@pytest.mark.slow
def test_meteor(refs_file):
    refs, _ = coco.load_references(refs_file, "test")
    out = coco.evaluate({"11": "A cup on a wooden table.", "13": "a dog"}, refs, meteor=True)
    assert out["per_image"]["11"]["METEOR"] > 0.9
    assert 0.0 <= out["per_image"]["13"]["METEOR"] < 0.2
