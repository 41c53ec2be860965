"""A manifest whose vocabulary does not match the decoder graph's output (edited, or put beside
another export's graphs) is refused in one line when the bundle opens, not an IndexError while
captioning."""

import json
import shutil

import cv2
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgecap.contract.manifest import ManifestError  # noqa: E402
from edgecap.runtime.session import Bundle  # noqa: E402
from tests._export_util import cnn_bundle  # noqa: E402


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("vocab")
    return cnn_bundle(root)


@pytest.mark.parametrize("change", [-3, 2], ids=["shorter", "longer"])
def test_a_vocabulary_of_another_size_is_refused_when_the_bundle_opens(bundle_dir, tmp_path, run_cli, change):
    copy = tmp_path / "b"
    shutil.copytree(bundle_dir, copy)
    data = json.loads((copy / "manifest.json").read_text())
    itos = data["vocab"]["itos"]
    words = len(itos)
    data["vocab"]["itos"] = itos[:change] if change < 0 else itos + [f"extra{i}" for i in range(change)]
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="come from different exports"):
        Bundle.load(copy)
    images = tmp_path / "images"
    images.mkdir()
    cv2.imwrite(str(images / "a.png"), np.full((16, 16, 3), 90, np.uint8))
    code, stdout, stderr = run_cli("run", copy, "--source", images)
    assert (code, stdout) == (1, "")
    assert stderr.strip().splitlines() == [
        f"edgecap run: error: {copy / 'manifest.json'}.vocab: {words + change} words, but decoder_step.onnx "
        f"scores {words} tokens per step (output 'logprobs' [4, {words}]); the vocabulary and the graph come "
        "from different exports"]
