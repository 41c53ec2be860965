"""What a training run says before its first step: a summary block, and one line for each
setting that would waste the hours to come (issue 30).

Warnings (each one line on stderr, `edgecap: warning: ...`):
- the visual front end has random weights (on the fly, or the features file says its
  features were extracted with random weights): its features are nearly the same for every
  image and the captioner learns one caption for all;
- the features of a sample of training images are nearly identical (mean pairwise cosine of
  their mean-pooled vectors above `SIMILAR_COSINE`), whatever made them;
- the warm-up is longer than the XE phase: the learning rate never reaches its peak;
- the XE schedule's peak learning rate is outside `SANE_PEAK_LR`.
"""

from __future__ import annotations

import sys

import torch

from edgecap.errors import random_front_end as random_front_end_message
from edgecap.errors import warn
from edgecap.train.schedules import xe_schedule

SIMILAR_COSINE = 0.98  # random resnet50 features: 0.994; trained backbones' COCO features: well below 0.9
SIMILAR_SAMPLE = 32  # images whose features are compared (pairwise)
SANE_PEAK_LR = (1e-5, 5e-3)  # Adam on Transformer / LSTM captioners: M2 4.4e-4, UpDown 5e-4, PMA 1e-4 .. 5e-4


def random_front_end(trainer) -> str | None:
    from edgecap.models.frontends import FRONT_END_KINDS, RANDOM

    vc = trainer.model_cfg.visual
    if vc.kind in FRONT_END_KINDS and not vc.weights:
        return random_front_end_message(vc.backbone, "pass --visual-weights FILE ([model].visual.weights)")
    made = trainer.features_provenance
    if made.get("weights_sha256") == RANDOM:
        return random_front_end_message(made.get("backbone", "features'"), f"{trainer.cfg.data.features} was "
                                        f"extracted without --weights: extract it again with --weights FILE")
    return None


@torch.no_grad()
def feature_similarity(trainer) -> float | None:
    """Mean pairwise cosine of the mean-pooled features of up to SIMILAR_SAMPLE training images
    (evenly spread over the split); None when the front end is trained with the captioner."""
    model = trainer.model
    takes_images = bool(getattr(model.visual, "takes_images", False))
    frozen = not any(p.requires_grad for p in model.visual.parameters())
    if takes_images and not frozen:
        return None  # a front end learned with the captioner: its features at step 0 mean nothing
    items = trainer.splits.train
    picks = [items[i * len(items) // SIMILAR_SAMPLE] for i in range(min(SIMILAR_SAMPLE, len(items)))]
    if len(picks) < 2:
        return None
    pooled = []
    for item in picks:
        inputs, mask = trainer.eval_source.load(item, None)
        feats, fmask = model.visual(inputs[None].to(trainer.device), None if mask is None else mask[None].to(trainer.device))
        weights = fmask[0].float()[:, None]
        pooled.append((feats[0].float() * weights).sum(0) / weights.sum().clamp(min=1))
    vectors = torch.nn.functional.normalize(torch.stack(pooled), dim=1)
    cos = vectors @ vectors.T
    n = len(picks)
    return float((cos.sum() - cos.diagonal().sum()) / (n * (n - 1)))


def xe_steps(trainer) -> int:
    from edgecap.data.datasets import EpochBatchSampler

    sampler = EpochBatchSampler(len(trainer.train_set), trainer.cfg.batch_size("xe"), rank=trainer.rank,
                                world=trainer.world)
    return trainer.cfg.schedule.epochs * sampler.batches_per_epoch()


def schedule_warnings(trainer) -> list[str]:
    cfg, out = trainer.cfg, []
    total = xe_steps(trainer)
    if total == 0:
        return out
    s = cfg.schedule
    schedule = xe_schedule(cfg, trainer.model_cfg.d_model)
    warmup = s.warmup if s.kind != "constant" else 0
    reached = max(schedule(1), schedule(max(1, min(warmup, total))))
    if warmup > total:
        out.append(f"[schedule].warmup = {warmup} steps is longer than the whole XE phase ({total} steps: "
                   f"{s.epochs} epoch{'s' if s.epochs != 1 else ''} of {total // s.epochs}); the learning rate only reaches {reached:.1e} "
                   f"and the run may learn nothing: lower warmup (e.g. --set schedule.warmup={max(1, total // 10)})")
    peak = max(schedule(1), schedule(max(1, warmup)))  # as designed, however long the run
    low, high = SANE_PEAK_LR
    if not low <= peak <= high:
        out.append(f"the XE learning rate peaks at {peak:.1e}, outside {low:.0e}..{high:.0e} where captioners "
                   f"train with Adam (M2: 4.4e-4); check [optim].lr = {cfg.optim.lr!r} ({s.kind} schedule)")
    return out


def start_warnings(trainer) -> list[str]:
    """Every warning that applies to this run, in the order they matter."""
    out = []
    front = random_front_end(trainer)
    if front:
        out.append(front)
    similar = feature_similarity(trainer)
    if similar is not None and similar > SIMILAR_COSINE:
        out.append(f"the features of {min(SIMILAR_SAMPLE, len(trainer.splits.train))} training images are nearly "
                   f"identical (mean pairwise cosine {similar:.3f} > {SIMILAR_COSINE}): a captioner cannot tell "
                   f"the images apart; check the front end's weights and the features file")
    out += schedule_warnings(trainer)
    return out


def summary_block(trainer) -> list[str]:
    """The run at a glance: data, vocabulary, steps per epoch, parameters, features grid, processes."""
    from edgecap.data.datasets import EpochBatchSampler

    cfg, mc, splits = trainer.cfg, trainer.model_cfg, trainer.splits
    images, features = trainer.data_files
    data = f"features {features}" if features else f"images {images}"
    params = trainer.model.num_parameters()
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    lines = [f"run {trainer.out}: {mc.name}{f' ({mc.family})' if mc.family != mc.name else ''}, {params:,} parameters ({trainable:,} trained), "
             f"on {trainer.device} x {trainer.world} process{'es' if trainer.world > 1 else ''}",
             f"  data: {trainer.karpathy}; {data}; train {len(splits.train)}, val {len(trainer.val_images)}"
             + (f", test {len(splits.test)}" if splits.test else "") + " images",
             f"  vocabulary: {len(trainer.vocab)} words ({_vocabulary_origin(cfg)}); captions up to "
             f"{mc.max_len} tokens",
             f"  visual: {mc.visual.kind}{f' {mc.visual.backbone}' if mc.visual.backbone else ''} -> "
             f"{mc.n_regions} regions x {mc.d_in}"]
    for phase in trainer.cfg.phases():
        sampler = EpochBatchSampler(len(trainer.train_set), trainer.cfg.batch_size(phase), rank=trainer.rank,
                                    world=trainer.world)
        epochs, patience = trainer.cfg.phase_epochs(phase), trainer.cfg.patience(phase)
        until = f"until {patience} epochs without a better validation (at most {epochs})" if patience else \
            f"{epochs} epoch{'s' if epochs != 1 else ''}"
        lines.append(f"  {phase}: {sampler.batches_per_epoch()} steps per epoch of {trainer.cfg.batch_size(phase)} "
                     f"images per process, {until}")
    lines.append(f"  validation: {len(trainer.val_images)} images, beam {cfg.run.val_beam}, CIDEr-D selects best.pt")
    return lines


def _vocabulary_origin(cfg) -> str:
    """Where the run's words come from: [data].min_count over the training captions, or the
    --init-from checkpoint (whose weights were trained on its own words: min_count plays no part)."""
    if cfg.run.init_from:
        return "the --init-from checkpoint's; [data].min_count does not apply"
    return f"min_count {cfg.data.min_count}"


def announce(trainer) -> None:
    """Rank 0, before the first step: the summary (unless --quiet), then the warnings (always)."""
    if not trainer.is_main:
        return
    if trainer.progress:
        print("\n".join(summary_block(trainer)), file=sys.stderr, flush=True)
    for line in start_warnings(trainer):
        warn(line)
