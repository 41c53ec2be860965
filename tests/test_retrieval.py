"""Caption retrieval (torch-free): embeddings, FAISS index, neighbours without self, CLI."""

import json
import subprocess
import sys

import numpy as np
import pytest

from edgecap.errors import EdgecapError
from edgecap.retrieval import CaptionIndex, RetrievalMemory, image_embeddings, memory_tokens
from edgecap.retrieval.memory import encode_caption


def clustered(n_groups=4, per_group=5, dim=16, seed=0):
    """Images in tight groups: each image's nearest others are its group mates."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_groups, dim)) * 5
    emb = np.concatenate([c + rng.normal(scale=0.1, size=(per_group, dim)) for c in centres])
    ids = [f"img{i}" for i in range(len(emb))]
    captions = [[f"group {i // per_group} image {i}", f"second caption {i}"] for i in range(len(emb))]
    return image_embeddings(emb[:, None, :]), ids, captions


def test_embedding_is_the_masked_mean_with_unit_norm():
    feats = np.zeros((2, 3, 4), np.float32)
    feats[0, 0] = [3, 0, 0, 0]
    feats[0, 1] = [0, 4, 0, 0]
    feats[0, 2] = [100, 100, 100, 100]  # padding
    feats[1] = 1
    mask = np.array([[True, True, False], [True, True, True]])
    emb = image_embeddings(feats, mask)
    np.testing.assert_allclose(emb[0], [0.6, 0.8, 0, 0], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-6)
    with pytest.raises(EdgecapError, match=r"expected \[B, N, D\]"):
        image_embeddings(feats[0])


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_neighbours_are_the_nearest_other_images(kind):
    emb, ids, captions = clustered()
    index = CaptionIndex.build(emb, ids, captions, kind=kind, k=4)
    assert index.meta["kind"] == kind and index.meta["count"] == 20
    assert index.meta["links"] == (32 if kind == "hnsw" else None)
    assert index.neighbours.shape == (20, 4)
    for row, found in enumerate(index.neighbours):
        assert row not in found  # never the image itself
        assert {r // 5 for r in found} == {row // 5}  # its four group mates
    # a query that is an indexed image, without exclusion, finds itself first
    rows, scores = index.search(emb[:3], 2)
    assert rows[:, 0].tolist() == [0, 1, 2]
    assert (scores[:, 0] >= scores[:, 1]).all()
    rows, _ = index.search(emb[:3], 2, exclude_ids=ids[:3])
    assert all(r not in rows[i] for i, r in enumerate(range(3)))


def test_fewer_images_than_k_pads_with_minus_one_and_pad_tokens():
    emb, ids, captions = clustered(n_groups=1, per_group=3)
    index = CaptionIndex.build(emb, ids, captions, k=4)
    assert (index.neighbours[:, 2:] == -1).all()
    stoi = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, "group": 4, "image": 5}
    memory = RetrievalMemory(index, stoi, k=4, length=6, bos=1, eos=2, pad=0, unk=3)
    tokens = memory.for_indexed(["img0"])
    assert tokens.shape == (1, 4, 6)
    # neighbours img1/img2: "group 0 image N" -> BOS group unk image unk EOS (length 6 fits it)
    assert tokens[0, 0].tolist() == [1, 4, 3, 5, 3, 2]
    assert (tokens[0, 2:] == 0).all()


def test_caption_encoding_truncates_but_keeps_eos():
    stoi = {"a": 4}
    assert encode_caption(["a"] * 10, stoi, 5, 1, 2, 0, 3).tolist() == [1, 4, 4, 4, 2]
    assert encode_caption(["b"], stoi, 5, 1, 2, 0, 3).tolist() == [1, 3, 2, 0, 0]
    table = np.arange(12).reshape(3, 4)
    out = memory_tokens(np.array([[2, -1]]), table, pad=0)
    assert out.tolist() == [[[8, 9, 10, 11], [0, 0, 0, 0]]]


def test_training_memory_can_pick_random_captions():
    emb, ids, captions = clustered()
    index = CaptionIndex.build(emb, ids, captions, k=4)
    stoi = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, "second": 4}
    memory = RetrievalMemory(index, stoi, k=4, length=6, bos=1, eos=2, pad=0, unk=3)
    first = memory.for_indexed(ids)
    assert not (first[:, :, 1] == 4).any()  # the first caption never starts with "second"
    picked = memory.for_indexed(ids, rng=np.random.default_rng(0))
    assert (picked[:, :, 1] == 4).any()
    with pytest.raises(EdgecapError, match="no image 'nope'"):
        memory.for_indexed(["nope"])
    more = RetrievalMemory(index, stoi, k=5, length=6, bos=1, eos=2, pad=0, unk=3)
    with pytest.raises(EdgecapError, match="stores 4 neighbours.*retrieval.k=5"):
        more.for_indexed(ids[:1])


def test_save_load_round_trip_and_damage(tmp_path):
    emb, ids, captions = clustered()
    index = CaptionIndex.build(emb, ids, captions, k=3, embedding_info={"source": "test"})
    index.save(tmp_path / "idx")
    loaded = CaptionIndex.load(tmp_path / "idx")
    assert loaded.image_ids == ids and loaded.captions == captions
    np.testing.assert_array_equal(loaded.neighbours, index.neighbours)
    np.testing.assert_array_equal(loaded.search(emb, 3)[0], index.search(emb, 3)[0])
    with pytest.raises(EdgecapError, match="already exists"):
        index.save(tmp_path / "idx")
    (tmp_path / "idx" / "neighbours.npy").unlink()
    with pytest.raises(EdgecapError, match="lacks neighbours.npy"):
        CaptionIndex.load(tmp_path / "idx")
    with pytest.raises(EdgecapError, match="not a directory"):
        CaptionIndex.load(tmp_path / "nothing")
    with pytest.raises(EdgecapError, match="3 embeddings but 2 image ids"):
        CaptionIndex.build(emb[:3], ids[:2], captions[:3])
    with pytest.raises(EdgecapError, match="query has 5 dimensions, the index has 16"):
        index.search(np.ones((1, 5), np.float32), 2)


def test_index_build_cli_from_hdf5_features(tmp_path, run_cli):
    from edgecap.data.features import FeatureWriter

    emb, ids, captions = clustered(n_groups=3, per_group=4)
    split = {"images": [
        {"cocoid": i, "filepath": "train", "filename": f"{i}.jpg", "split": "train" if i < 10 else "test",
         "sentences": [{"raw": c} for c in captions[i]]} for i in range(12)]}
    (tmp_path / "dataset_coco.json").write_text(json.dumps(split))
    rng = np.random.default_rng(1)
    with FeatureWriter(tmp_path / "feats.h5") as writer:
        for i in range(12):  # grid features whose mean is the clustered embedding
            grid = emb[i] + rng.normal(scale=0.01, size=(9, 16))
            writer.write(str(i), grid.astype(np.float32))
    code, out, err = run_cli("index", "build", "--features", tmp_path / "feats.h5", "--split-file",
                             tmp_path / "dataset_coco.json", "--out", tmp_path / "idx", "-k", "3")
    assert code == 0, err
    assert "indexed 10 images (16-d, flat, inner product)" in out and "index size" in out
    index = CaptionIndex.load(tmp_path / "idx")
    assert index.meta["embedding"]["source"] == "features" and index.meta["build_seconds"] >= 0
    assert index.captions[0] == ["group 0 image 0", "second caption 0"]
    assert {int(index.image_ids[r]) // 4 for r in index.neighbours[0]} == {0}
    code, _, err = run_cli("index", "build", "--features", tmp_path / "feats.h5", "--split-file",
                           tmp_path / "dataset_coco.json", "--out", tmp_path / "idx")
    assert code == 1 and "already exists" in err
    build = ["index", "build", "--features", tmp_path / "feats.h5", "--split-file", tmp_path / "dataset_coco.json"]
    code, _, err = run_cli(*build, "--out", tmp_path / "idx", "-k", "2", "--force")
    assert code == 0, err
    assert CaptionIndex.load(tmp_path / "idx").meta["k"] == 2
    # --force replaces only an index of ours: a user's directory is left alone, named in one line
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep")
    (mine / "sub" / "data.csv").write_text("1,2")
    code, _, err = run_cli(*build, "--out", mine, "--force")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "not an edgecap retrieval index" in err and "notes.txt, sub/data.csv" in err
    assert (mine / "notes.txt").read_text() == "keep" and (mine / "sub" / "data.csv").read_text() == "1,2"
    code, _, err = run_cli("index", "build", "--checkpoint", tmp_path / "x.pt", "--split-file",
                           tmp_path / "dataset_coco.json", "--out", tmp_path / "idx2")
    assert code == 1 and "--checkpoint needs --images" in err


def test_retrieval_imports_no_torch():
    code = ("import sys, edgecap.retrieval, edgecap.retrieval.index, edgecap.retrieval.memory\n"
            "print(sorted(m for m in ('torch', 'edgecap.models') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_index_build_over_features_of_mixed_widths_is_one_line(tmp_path, run_cli):
    """An HDF5 in M2's layout (`<id>_features`, written here with h5py as M2's extractor
    does) whose images come from two extractors: one line naming both, no numpy traceback."""
    h5py = pytest.importorskip("h5py")
    split = {"images": [{"cocoid": i, "filepath": "train", "filename": f"{i}.jpg", "split": "train",
                         "sentences": [{"raw": f"caption {i}"}]} for i in range(3)]}
    (tmp_path / "dataset_coco.json").write_text(json.dumps(split))
    with h5py.File(tmp_path / "mixed.hdf5", "w") as f:
        for i, width in enumerate((16, 16, 12)):
            f.create_dataset(f"{i}_features", data=np.ones((5, width), np.float32))
    code, out, err = run_cli("index", "build", "--features", tmp_path / "mixed.hdf5", "--split-file",
                             tmp_path / "dataset_coco.json", "--out", tmp_path / "idx", "-k", "1")
    assert (code, out) == (1, "")
    assert err.strip().splitlines() == [
        f"edgecap index: error: features {tmp_path / 'mixed.hdf5'}: image 2 has features 12 wide, image 0 16 wide; "
        "an index is built over the features of one extractor"]
    assert not (tmp_path / "idx").exists()
