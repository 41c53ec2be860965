"""Local pretrained weights and the open_clip grid-token front end (a tiny ViT config whose
weights the test writes with open_clip itself)."""

import json

import numpy as np
import pytest
import torch

from edgecap.errors import EdgecapError
from edgecap.models import build
from edgecap.models.checkpoint import load_checkpoint, save_checkpoint
from edgecap.models.frontends import build_frontend, frontend_overrides
from edgecap.models.pretrained import resolve_weights, sha256_file
from tests.conftest import tiny_overrides

open_clip = pytest.importorskip("open_clip")

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16},
    "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(config .json, full-CLIP weights file, the CLIP model those weights came from)."""
    root = tmp_path_factory.mktemp("openclip")
    config = root / "edgecap-test-vit.json"
    config.write_text(json.dumps(TINY))
    open_clip.add_model_config(config)
    torch.manual_seed(0)
    model = open_clip.create_model("edgecap-test-vit", pretrained=None, pretrained_image=False, pretrained_text=False)
    with torch.no_grad():  # move LayerNorms off their identity init so ln_post matters
        for name, p in model.visual.named_parameters():
            if "ln" in name:
                p.add_(torch.randn_like(p) * 0.2)
    weights = root / "tiny_clip.pt"
    torch.save(model.state_dict(), weights)
    return config, weights, model.eval()


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch):
    """Any attempt by open_clip to fetch weights fails the test."""
    import open_clip.factory as factory
    import open_clip.pretrained as pretrained

    def refuse(*args, **kwargs):
        raise AssertionError("open_clip tried to download weights")

    for module in (factory, pretrained):
        for name in ("download_pretrained", "download_pretrained_from_hf", "download_pretrained_from_url"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, refuse)


def reference_tokens(clip_visual, images):
    """Patch tokens of the last block after ln_post, CLS dropped, computed step by step."""
    with torch.no_grad():
        x = clip_visual._embeds(images)
        x = clip_visual.transformer(x)
        return clip_visual.ln_post(x)[:, 1:]


def tokens_of(frontend, images):
    return frontend(images)[0]


def test_missing_weights_is_a_one_line_error_naming_the_path(tiny, tmp_path):
    config, _, _ = tiny
    missing = tmp_path / "ViT-L-14.bin"
    with pytest.raises(EdgecapError) as info:
        build_frontend(str(config), weights=str(missing))
    message = str(info.value)
    assert str(missing) in message and "never downloaded" in message and "\n" not in message
    with pytest.raises(EdgecapError, match="no weights file given"):
        resolve_weights("")


def test_sha256_is_checked(tiny):
    _, weights, _ = tiny
    digest = sha256_file(weights)
    assert resolve_weights(weights, digest.upper()) == weights
    with pytest.raises(EdgecapError, match=f"has sha256 {digest}, expected 0+$"):
        resolve_weights(weights, "0" * 64)


def test_grid_tokens_are_the_loaded_weights_patch_tokens(tiny):
    config, weights, clip = tiny
    visual = build_frontend(str(config), weights=str(weights))
    prep = visual.cfg.visual
    # open_clip's recipe: shorter side to the input size (bicubic), centre crop, OpenAI mean/std
    assert (prep.image_size, prep.resize, prep.channel_order, prep.crop, prep.resize_size) == (
        64, "bicubic", "RGB", "center", 64)
    assert np.allclose(prep.mean, open_clip.OPENAI_DATASET_MEAN) and np.allclose(prep.std, open_clip.OPENAI_DATASET_STD)
    images = torch.randn(2, 3, 64, 64)
    tokens = tokens_of(visual, images)
    assert tokens.shape == (2, (64 // 16) ** 2, 64)  # 4x4 grid, CLS excluded, ViT width
    assert torch.allclose(tokens, reference_tokens(clip.visual, images), atol=1e-5)
    fresh = open_clip.create_model("edgecap-test-vit", pretrained=None, pretrained_image=False, pretrained_text=False)
    assert not torch.allclose(tokens, reference_tokens(fresh.visual.eval(), images), atol=1e-3)


def test_visual_only_state_dict_and_mismatched_weights(tiny, tmp_path):
    config, _, clip = tiny
    visual_only = tmp_path / "visual.pt"
    torch.save({"state_dict": clip.visual.state_dict()}, visual_only)
    visual = build_frontend(str(config), weights=str(visual_only))
    images = torch.randn(1, 3, 64, 64)
    assert torch.allclose(tokens_of(visual, images), reference_tokens(clip.visual, images), atol=1e-5)
    with pytest.raises(EdgecapError, match="do not fit backbone 'ViT-B-32': class_embedding has shape"):
        build_frontend("ViT-B-32", weights=str(visual_only))
    with pytest.raises(EdgecapError, match="did you mean 'ViT-B-32'"):
        build_frontend("ViT-B-23", weights=str(visual_only))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(EdgecapError, match="junk.pt are not a readable state dict: not a torch.save or safetensors file$"):
        build_frontend(str(config), weights=str(tmp_path / "junk.pt"))


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.module."], ids=["ddp", "ddp+compile"])
def test_open_clip_training_checkpoint_loads_its_visual_tower(tiny, tmp_path, prefix):
    """What open_clip's training script saves: epoch, name, the optimizer, and the DDP model's
    state dict (keys "module.visual...", with torch.compile also "_orig_mod.") under "state_dict"."""
    config, _, clip = tiny
    optimizer = torch.optim.AdamW(clip.parameters(), lr=1e-4)
    checkpoint = {"epoch": 32, "name": "edgecap-test-vit-run", "optimizer": optimizer.state_dict(),
                  "state_dict": {prefix + k: v for k, v in clip.state_dict().items()}}
    path = tmp_path / "epoch_32.pt"
    torch.save(checkpoint, path)
    images = torch.randn(2, 3, 64, 64)
    tokens = tokens_of(build_frontend(str(config), weights=str(path)), images)
    assert torch.allclose(tokens, reference_tokens(clip.visual, images), atol=1e-5)


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::torch.jit.TracerWarning")
def test_openai_torchscript_clip_archive_loads_into_a_quickgelu_tower(tiny, tmp_path):
    """OpenAI's own CLIP files (ViT-B-32.pt as `clip.load` caches it) are TorchScript archives
    of the whole model in float16, keys "visual.*", trained with QuickGELU; open_clip reads them
    with torch.jit.load into its -quickgelu configs."""
    config, _, clip = tiny
    quick = tmp_path / "edgecap-test-vit-quickgelu.json"
    quick.write_text(json.dumps({**TINY, "quick_gelu": True}))
    open_clip.add_model_config(quick)
    openai = open_clip.create_model(quick.stem, pretrained=None, pretrained_image=False, pretrained_text=False)
    openai.load_state_dict(clip.state_dict())
    visual = openai.visual.half().float().eval()  # the released weights are fp16

    class OpenAIStyle(torch.nn.Module):
        def __init__(self, visual):
            super().__init__()
            self.visual = visual

        def forward(self, images):
            return self.visual(images)

    archive = tmp_path / "ViT-B-32.pt"
    traced = torch.jit.trace(OpenAIStyle(visual), torch.randn(1, 3, 64, 64), check_trace=False)
    torch.jit.save(traced.half(), archive)
    images = torch.randn(2, 3, 64, 64)
    tokens = tokens_of(build_frontend(str(quick), weights=str(archive)), images)
    assert torch.allclose(tokens, reference_tokens(visual.float(), images), atol=1e-5)
    # the same file in a GELU tower would give features OpenAI's model never made
    with pytest.raises(EdgecapError, match=r"OpenAI's CLIP release, trained with QuickGELU, but backbone "
                                           r".* uses GELU: use --backbone edgecap-test-vit-quickgelu"):
        build_frontend(str(config), weights=str(archive))


def test_open_clip_front_end_in_a_captioner(tiny, tmp_path):
    config, weights, clip = tiny
    over = {**tiny_overrides("smart"), **frontend_overrides(str(config), weights=str(weights), sha256=sha256_file(weights))}
    model = build("smart", **over).eval()
    cfg = model.cfg
    assert (cfg.d_in, cfg.n_regions, cfg.visual.image_size, cfg.visual.resize) == (64, 16, 64, "bicubic")
    assert cfg.encoder_positions == "sinusoidal"
    assert all(not p.requires_grad for p in model.visual.parameters())
    assert not any("token_embedding" in k for k in model.state_dict())  # the text tower is dropped
    images = torch.randn(2, 3, 64, 64)
    feats, mask = model.visual(images)
    assert feats.shape == (2, 16, 64) and mask.all()
    tokens = torch.tensor([[cfg.bos_id, 5, 6], [cfg.bos_id, 7, 8]])
    with torch.no_grad():
        logprobs = model(feats, mask, tokens)
    assert logprobs.shape == (2, 3, cfg.vocab_size)
    # The checkpoint carries the backbone weights; loading rebuilds the same front end.
    from edgecap.contract.vocab import Vocab

    vocab = Vocab(["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(cfg.vocab_size - 4)])
    path = save_checkpoint(tmp_path / "clip_smart.pt", model, vocab)
    weights.rename(weights.with_suffix(".moved"))  # loading needs the checkpoint only
    try:
        again = load_checkpoint(path).model
    finally:
        weights.with_suffix(".moved").rename(weights)
    assert torch.allclose(again.visual(images)[0], feats, atol=1e-6)
    assert again.cfg.visual.weights == str(weights)  # the provenance survives the round trip


def test_config_that_disagrees_with_the_backbone_is_refused(tiny):
    config, weights, _ = tiny
    over = {**tiny_overrides("smart"), **frontend_overrides(str(config), weights=str(weights))}
    over["n_regions"] = 17  # e.g. someone counted the CLS token
    with pytest.raises(EdgecapError, match=r"config n_regions=17, but the backbone needs 16"):
        build("smart", **over)
    over = {**tiny_overrides("smart"), **frontend_overrides(str(config), weights=str(weights))}
    over["visual"] = {**over["visual"], "mean": (0.485, 0.456, 0.406)}
    with pytest.raises(EdgecapError, match=r"config visual.mean=\(0.485"):
        build("smart", **over)
