"""A command copied from the docs before the data is downloaded names the missing file and
where it comes from, in one line (nothing here can be downloaded for the user)."""

import pytest

KARPATHY = "dataset_coco.json in Karpathy's caption_datasets.zip (docs/training.md#getting-coco)"
M2 = "linked from the README of aimagelab/meshed-memory-transformer on GitHub (docs/pretrained.md)"


@pytest.mark.parametrize("argv, missing, source", [
    (["index", "build", "--features", "coco_vitl14.h5", "--split-file", "dataset_coco.json",
      "--out", "coco_index"], "Karpathy split file dataset_coco.json does not exist", KARPATHY),
    (["features", "extract", "--backbone", "ViT-L-14", "--images", "coco/images", "--split-file",
      "coco/dataset_coco.json", "--out", "coco_vitl14.h5"],
     "split file coco/dataset_coco.json does not exist", KARPATHY),
    (["import-m2", "--weights", "meshed_memory_transformer.pth", "--vocab", "vocab.pkl",
      "--out", "m2.pt"], "M2 checkpoint meshed_memory_transformer.pth does not exist", M2),
])
def test_a_missing_dataset_or_checkpoint_says_where_to_get_it(argv, missing, source, tmp_path,
                                                              monkeypatch, run_cli):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(*argv)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert missing in err and source in err
    assert list(tmp_path.iterdir()) == []
