import os
import signal
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    """A shell starts `&` jobs (and CI runners some jobs) with SIGINT ignored, and Python then
    leaves it ignored; the signal tests and the processes they start need Ctrl-C's usual meaning."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def tiny_overrides(name: str) -> dict:
    """Small sizes that keep each family's structure (layers, memory, gates) but run fast."""
    over = dict(vocab_size=40, d_model=32, n_heads=4, d_ff=64, d_in=24, n_regions=6, max_len=8, dropout=0.1)
    if name.startswith("pma"):
        over["prototype"] = {"count": 6}
    if name == "updown":
        over["lstm"] = {"hidden": 40, "embed": 24, "attention_hidden": 16}
    return over


@pytest.fixture
def run_cli(capsys):
    """Run the edgecap CLI in-process: returns (exit code, stdout, stderr)."""
    from edgecap.cli import main

    def _run(*argv):
        code = main([str(a) for a in argv])
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny synthetic world tests/_train_tiny.py's configs train on (40 images of 32 px,
    seed 3), one per test module; a module that needs another world defines its own."""
    from edgecap.data.synth import generate_dataset

    root = tmp_path_factory.mktemp("world") / "data"
    generate_dataset(root, 40, seed=3, size=32, sequences=0, video_frames=0, progress=False)
    return root


@pytest.fixture
def python():
    return sys.executable


def random_batch(model, b=3, length=6, seed=1):
    """Seeded features, mask (the last image half padded) and BOS-started tokens for `model`."""
    import torch

    g = torch.Generator().manual_seed(seed)
    cfg = model.cfg
    feats = torch.randn(b, cfg.n_regions, cfg.d_in, generator=g)
    mask = torch.ones(b, cfg.n_regions, dtype=torch.bool)
    mask[-1, cfg.n_regions // 2 :] = False
    tokens = torch.randint(4, cfg.vocab_size, (b, length), generator=g)
    tokens[:, 0] = cfg.bos_id
    return feats, mask, tokens, g


def teacher_forcing_losses(model, feats, mask, tokens, steps, *extra, lr=3e-3):
    """Adam on one fixed batch with teacher forcing; the loss after each step."""
    return _adam_losses(model, lambda: model(feats, mask, tokens[:, :-1], *extra), tokens, steps, lr)


def pixel_losses(model, images, tokens, steps, *extra, pad_id, lr=3e-3):
    """As `teacher_forcing_losses` from images: the model's front end runs on every step and
    learns with the rest, unless its parameters were frozen (requires_grad off)."""
    return _adam_losses(model, lambda: model(*model.visual(images), tokens[:, :-1], *extra), tokens, steps, lr,
                        ignore_index=pad_id)


def _adam_losses(model, forward, tokens, steps, lr, ignore_index=-100):
    import torch

    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(steps):
        logprobs = forward()
        loss = torch.nn.functional.nll_loss(logprobs.reshape(-1, logprobs.shape[-1]), tokens[:, 1:].reshape(-1),
                                            ignore_index=ignore_index)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def world_images(world, items, visual):
    """The images of Karpathy `items` in a synthetic world on disk, preprocessed as the
    VisualConfig `visual` says: a [B, 3, H, W] float32 array."""
    from pathlib import Path

    import cv2
    import numpy as np

    from edgecap.contract.preprocess import preprocess

    return np.stack([preprocess(cv2.imread(str(Path(world) / "images" / i.path)), visual.image_size, visual.mean,
                                visual.std, visual.resize, visual.channel_order) for i in items])


def caption_tokens(items, vocab, max_len):
    """The first caption of each Karpathy item as BOS..EOS token ids, padded into [B, T]."""
    import torch

    return torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(vocab.encode(list(i.captions[0]), max_len)) for i in items], batch_first=True)


def fake_tensorrt(version: str, **classes):
    """A stand-in `tensorrt` module: its version and the given classes, nothing else."""
    import types

    module = types.ModuleType("tensorrt")
    module.__version__ = version
    for name, cls in classes.items():
        setattr(module, name, cls)
    return module
