"""Real-size visual front ends: the listed architectures at a small input size, their weights
files as open_clip / torchvision write them, the fp32 parity gate on their visual graphs, and
the whole path features extract -> train on cached features -> export with the front end ->
`edgecap run` on a video."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
pytest.importorskip("open_clip")

from edgecap.errors import EdgecapError  # noqa: E402
from edgecap.export.compat import check_file  # noqa: E402
from edgecap.models.frontends import FRONT_ENDS, RANDOM, build_frontend, frontend_overrides  # noqa: E402
from tests._export_util import export, save_tiny  # noqa: E402

SIZE = 64  # 2 x 2 grid at stride 32, 4 x 4 at ViT-B-16's 16
# ViT-L-14 (304 M parameters) takes ~2 min to export on 2 cores: its export is a benchmark row
# (benchmarks/pipeline.py); here it is built and its grid checked at 56 px.
EXPORTED = [name for name in FRONT_ENDS if name != "ViT-L-14"]


def small_captioner(name: str, size: int = SIZE) -> dict:
    return frontend_overrides(name, image_size=size)


@pytest.mark.parametrize("name", EXPORTED)
def test_front_end_exports_with_a_passing_fp32_parity_gate(name, tmp_path):
    info = FRONT_ENDS[name]
    ckpt = save_tiny(tmp_path / "m.pt", "smart", **small_captioner(name))
    result = export(ckpt, tmp_path / "bundle")
    m = result.manifest
    report = m.parity["onnxruntime"]
    assert report.passed and report.greedy_identical == 1.0 and report.beam_identical == 1.0
    assert report.visual_beam_identical == 1.0 and report.feature_scale > 0.5
    assert 0 < report.max_abs_delta["visual"] <= 1e-3 * max(1.0, report.feature_scale)
    visual = m.graph("visual")
    grid = (SIZE // info.stride) ** 2
    assert visual.outputs[0].shape == [2, grid, info.width] and visual.inputs[0].shape == [2, 3, SIZE, SIZE]
    assert (m.checks["visual.onnx"].tensorrt_compatible, m.checks["visual.onnx"].problems) == (True, [])
    # what the TensorRT path runs before a build: polygraphy loads and runs the graph
    report = check_file(result.path / "visual.onnx")
    assert report.ok and report.polygraphy["ran"] and report.polygraphy["dynamic_inputs"] == []
    assert m.frontend.backbone == name and m.frontend.weights == RANDOM
    assert m.frontend.weights_sha256 == RANDOM and m.frontend.width == info.width
    assert m.preprocessing.crop == "center" and m.preprocessing.size == SIZE
    assert m.preprocessing.resize_size >= SIZE


def test_int8_vit_visual_graph_reports_its_own_caption_agreement(tmp_path):
    ckpt = save_tiny(tmp_path / "m.pt", "smart", **small_captioner("ViT-B-32"))
    result = export(ckpt, tmp_path / "bundle", precision="int8")
    assert result.manifest.graph("visual").precision == "int8"  # the ViT's MatMuls are quantised
    report = result.parity["onnxruntime"]
    assert report.precision == "int8" and report.passed  # reported, not gated
    assert 0 <= report.visual_beam_identical <= 1 and report.max_abs_delta["visual"] > 1e-3


def test_fp16_visual_graph_reports_its_feature_delta_without_gating_on_it(tmp_path):
    ckpt = save_tiny(tmp_path / "m.pt", "smart", **small_captioner("mobilenet_v3_large"))
    result = export(ckpt, tmp_path / "bundle", precision="fp16")
    assert result.manifest.graph("visual").precision == "fp16"
    report = result.parity["onnxruntime"]
    assert report.precision == "fp16" and report.passed
    # half precision through a CNN is far outside the fp32 tolerance: reported, not a failure
    delta, scale = report.max_abs_delta["visual"], report.feature_scale
    assert 1e-3 * scale < delta < 0.5 * scale
    assert 0 <= report.visual_beam_identical <= 1


def test_vit_l_14_grid_at_a_small_input():
    frontend = build_frontend("ViT-L-14", 56)
    feats, mask = frontend(torch.randn(1, 3, 56, 56))
    assert feats.shape == (1, 16, 1024) and mask.all()
    assert frontend.cfg.visual.crop == "center" and frontend.cfg.visual.resize == "bicubic"


def test_front_ends_are_frozen_and_stay_in_eval_mode():
    from edgecap.models import build

    model = build("smart", **{"vocab_size": 20, "d_model": 32, "n_heads": 4, "d_ff": 64, **small_captioner("resnet50")})
    model.train()
    assert not model.visual.training and not any(m.training for m in model.visual.modules())
    assert not any(p.requires_grad for p in model.visual.parameters())
    stats = model.visual.backbone[1].running_mean.clone()
    model.visual(torch.randn(2, 3, SIZE, SIZE))
    assert torch.equal(stats, model.visual.backbone[1].running_mean)  # BatchNorm statistics never move


def test_random_weights_are_seeded_and_scaled():
    x = torch.randn(2, 3, SIZE, SIZE)
    a, b = build_frontend("efficientnet_b0", SIZE)(x)[0], build_frontend("efficientnet_b0", SIZE)(x)[0]
    assert torch.equal(a, b)  # extract, train and export build the same random backbone
    # BatchNorm statistics from seeded noise: unit-scale features, not the ~1e-13 of a bare init
    assert 0.1 < float(a.std()) < 100


def test_torchvision_weights_file_as_torchvision_writes_it(tmp_path):
    torch.manual_seed(5)
    reference = torchvision.models.mobilenet_v3_large(weights=None).eval()
    with torch.no_grad():  # statistics a bare init would not have: the file's must be used
        for m in reference.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
    path = tmp_path / "mobilenet_v3_large.pth"
    torch.save(reference.state_dict(), path)
    frontend = build_frontend("mobilenet_v3_large", SIZE, str(path))
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        want = reference.features(x).flatten(2).transpose(1, 2)
    assert torch.allclose(frontend(x)[0], want, atol=1e-5)
    # wrapped the way training scripts save, with DataParallel's prefix
    wrapped = tmp_path / "wrapped.pt"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in reference.state_dict().items()}}, wrapped)
    assert torch.allclose(build_frontend("mobilenet_v3_large", SIZE, str(wrapped))(x)[0], want, atol=1e-5)
    # a safetensors file under a name that does not say so
    from safetensors.torch import save_file

    renamed = tmp_path / "model.bin"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, renamed)
    assert torch.allclose(build_frontend("mobilenet_v3_large", SIZE, str(renamed))(x)[0], want, atol=1e-5)
    # older torch.hub files (resnet18-5c106cde.pth, ...) are in torch.save's legacy, non-zip format
    legacy = tmp_path / "mobilenet_v3_large-legacy.pth"
    torch.save(reference.state_dict(), legacy, _use_new_zipfile_serialization=False)
    assert torch.allclose(build_frontend("mobilenet_v3_large", SIZE, str(legacy))(x)[0], want, atol=1e-5)


def test_weights_for_another_architecture_are_a_one_line_error(tmp_path):
    path = tmp_path / "efficientnet_b0.pth"
    torch.save(torchvision.models.efficientnet_b0(weights=None).state_dict(), path)
    with pytest.raises(EdgecapError, match=r"torchvision weights .*efficientnet_b0.pth do not fit backbone "
                                           r"'mobilenet_v3_large': features.0.0.weight has shape \(32, 3, 3, 3\)") as info:
        build_frontend("mobilenet_v3_large", SIZE, str(path))
    assert "\n" not in str(info.value)
    with pytest.raises(EdgecapError, match="does not exist"):
        build_frontend("resnet50", SIZE, str(tmp_path / "missing.pth"))
    # a whole pickled model (torch.save(model)): named as such, never unpickled, no colour codes
    whole = tmp_path / "whole.pth"
    torch.save(torchvision.models.efficientnet_b0(weights=None), whole)
    with pytest.raises(EdgecapError) as info:
        build_frontend("efficientnet_b0", SIZE, str(whole))
    assert str(info.value) == (f"torchvision weights {whole} hold pickled Python objects "
                               "(torchvision.models.efficientnet.EfficientNet), not only tensors (a whole model "
                               "saved with torch.save(model)?); they are never unpickled here: save "
                               "model.state_dict() instead")


def test_open_clip_vit_weights_at_another_input_size_get_resized_positions(tmp_path):
    """A ViT-B-32 state dict written by open_clip at 224 px, loaded for 64 px input."""
    import open_clip

    torch.manual_seed(1)
    clip = open_clip.create_model("ViT-B-32", pretrained=None, pretrained_image=False, pretrained_text=False)
    path = tmp_path / "vit_b_32.pt"
    torch.save(clip.state_dict(), path)
    frontend = build_frontend("ViT-B-32", SIZE, str(path))
    pos = frontend.backbone.positional_embedding
    assert pos.shape == (1 + 4, 768)
    assert torch.equal(pos[0], clip.visual.positional_embedding[0])  # the class position is kept
    assert torch.equal(frontend.backbone.conv1.weight, clip.visual.conv1.weight)


def test_input_size_off_the_grid_is_refused():
    with pytest.raises(EdgecapError, match=r"image_size 70 is not a multiple of its stride 32 \(choose e.g. 64 or 96\)"):
        frontend_overrides("resnet50", image_size=70)
    with pytest.raises(EdgecapError, match=r"unknown front end 'resnet5'.*did you mean 'resnet50'"):
        frontend_overrides("resnet5")


def test_center_crop_matches_torchvision_geometry():
    """contract.preprocess with crop "center" = torchvision's Resize(short) + CenterCrop(size)."""
    import cv2
    from torchvision.transforms import InterpolationMode, v2

    from edgecap.contract.preprocess import preprocess

    rng = np.random.default_rng(0)
    image = cv2.resize(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8), (200, 150), interpolation=cv2.INTER_CUBIC)
    for frame in (image, np.ascontiguousarray(image.transpose(1, 0, 2))):  # landscape and portrait
        ours = preprocess(frame, 64, (0, 0, 0), (1, 1, 1), "bilinear", "RGB", crop="center", resize_size=72)
        rgb = torch.from_numpy(frame[:, :, ::-1].copy()).permute(2, 0, 1)
        tv = v2.Compose([v2.Resize(72, interpolation=InterpolationMode.BILINEAR, antialias=False), v2.CenterCrop(64)])
        theirs = tv(rgb).float().numpy() / 255
        assert ours.shape == theirs.shape == (3, 64, 64)
        assert np.abs(ours - theirs).mean() < 2e-3  # uint8 rounding; one pixel off is ~5e-2
        assert np.abs(ours[:, 1:] - theirs[:, :-1]).mean() > 2e-2


# --- the whole pipeline with a cached front end -------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from edgecap.data.synth import generate_dataset

    root = tmp_path_factory.mktemp("frontend-world") / "data"
    generate_dataset(root, 16, seed=4, size=80, sequences=0, video_frames=8, progress=False)
    return root


TINY_CAPTIONER = {"preset": "smart", "d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 10, "memory": {"slots": 4}}


def tiny_train_config(world, model, features=""):
    from edgecap.train.config import parse_config

    data = {"karpathy": str(world / "dataset_coco.json"), "batch_size": 4, "min_count": 1, "val_batch_size": 8}
    data.update({"features": features} if features else {"images": str(world / "images")})
    return parse_config({"model": model, "data": data, "optim": {"lr": 0.05},
                         "schedule": {"kind": "noam", "epochs": 1, "warmup": 10},
                         "run": {"log_every": 1, "threads": 1, "seed": 0}}, source="frontend.toml")


def test_cached_features_train_export_and_run_on_a_video(world, tmp_path, run_cli):
    import cv2

    from edgecap.data.features import FeatureStore
    from edgecap.runtime.captioner import Captioner
    from edgecap.train.loop import Trainer

    feats = tmp_path / "feats.h5"
    code, stdout, stderr = run_cli("features", "extract", "--backbone", "mobilenet_v3_large", "--image-size", SIZE,
                                   "--images", world / "images", "--split-file", world / "dataset_coco.json",
                                   "--out", feats, "--batch-size", 8)
    assert code == 0, stderr
    assert "16 images written, 0 already present; 4 tokens x 960 per image" in stdout
    cfg = tiny_train_config(world, dict(TINY_CAPTIONER), features=str(feats))
    model_cfg = cfg.model_config(50)
    # the captioner's input follows from the file: nothing to copy by hand
    assert (model_cfg.d_in, model_cfg.n_regions, model_cfg.encoder_positions) == (960, 4, "sinusoidal")
    summary = Trainer(cfg, out=tmp_path / "run", progress=False).run()
    ckpt = tmp_path / "run" / "best.pt"
    from edgecap.train.command import report

    # the run's last lines suggest the export that gives a camera bundle, not a features one
    next_line = next(line for line in report(summary) if line.startswith("next: "))
    assert next_line.split("   (")[0] == \
        f"next: edgecap export {ckpt} --target cpu-ort-fp32 --frontend mobilenet_v3_large"

    bundle = tmp_path / "bundle"
    args = ["export", ckpt, "--engine", "onnx", "--batch", 1, "--beam", 2, "--samples", 2,
            "--frontend", "mobilenet_v3_large", "--out", bundle, "--quiet"]
    # the run saw features only: the gate finds the images beside the training data's dataset_coco.json
    code, stdout, stderr = run_cli(*args)
    assert code == 0, stderr
    assert f"parity inputs: the training data {world / 'dataset_coco.json'}" in stdout
    assert "visual graph alone: beam 100% identical" in stdout
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["input"] == "images" and manifest["frontend"]["weights"] == RANDOM
    assert manifest["preprocessing"]["crop"] == "center" and manifest["preprocessing"]["size"] == SIZE

    # the bundle's visual graph computes the features the captioner was trained on
    captioner = Captioner.from_bundle(bundle)
    item = json.loads((world / "dataset_coco.json").read_text())["images"][0]
    frame = cv2.imread(str(world / "images" / item["filepath"] / item["filename"]))
    got, _ = captioner.bundle.visual(captioner.preprocess_into([frame]))
    with FeatureStore(feats) as store:
        assert np.allclose(got[0], store.raw(item["cocoid"]), atol=1e-3)

    out = tmp_path / "captions.jsonl"
    code, stdout, stderr = run_cli("run", bundle, "--source", world / "video" / "tabletop.mp4", "--pace", "every",
                                   "--no-coverage", "--jsonl", out)
    assert code == 0, stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 8 and all(r["caption"] for r in records)
    assert set(records[0]["latency_ms"]) >= {"preprocess", "visual", "encoder", "decode"}


def test_attaching_another_front_end_than_the_features_came_from_is_refused(world, tmp_path, run_cli):
    from edgecap.data.features_command import extract_features, read_split_images
    from edgecap.train.loop import Trainer

    items = read_split_images(world / "dataset_coco.json", world / "images")
    extract_features("efficientnet_b0", "", items, tmp_path / "f.h5", batch_size=8, progress=False, image_size=SIZE)
    Trainer(tiny_train_config(world, dict(TINY_CAPTIONER), str(tmp_path / "f.h5")), out=tmp_path / "run",
            progress=False).run()
    ckpt = tmp_path / "run" / "best.pt"
    code, _, stderr = run_cli("export", ckpt, "--engine", "onnx", "--frontend", "resnet50", "--out", tmp_path / "b")
    assert code != 0 and "gives d_in=2048, but the checkpoint's captioner was trained with d_in=1280" in stderr
    other = tmp_path / "effnet.pth"
    torch.save(torchvision.models.efficientnet_b0(weights=None).state_dict(), other)
    code, _, stderr = run_cli("export", ckpt, "--engine", "onnx", "--frontend", "efficientnet_b0",
                              "--visual-weights", other, "--out", tmp_path / "b")
    assert code != 0 and "were made with weights_sha256='random'" in stderr
    assert not (tmp_path / "b").exists()


def test_training_with_the_front_end_on_the_fly(world, tmp_path, run_cli):
    from edgecap.models.checkpoint import load_checkpoint
    from edgecap.train.loop import Trainer

    model = {**TINY_CAPTIONER, "visual": {"kind": "torchvision", "backbone": "mobilenet_v3_large", "image_size": SIZE}}
    Trainer(tiny_train_config(world, model), out=tmp_path / "run", progress=False).run()
    ckpt = load_checkpoint(tmp_path / "run" / "best.pt")
    reference = build_frontend("mobilenet_v3_large", SIZE)
    assert torch.equal(ckpt.model.visual.backbone[0][0].weight, reference.backbone[0][0].weight)  # frozen
    result = export(tmp_path / "run" / "best.pt", tmp_path / "bundle")
    assert result.parity["onnxruntime"].passed
