"""Learning-rate schedules as pure functions of the step, and the optimizers they drive.

The trainer sets every parameter group's lr to `schedule(step)` before each optimizer step,
so a schedule has no state of its own: resuming at step s gives exactly the lr of an
uninterrupted run.

- `noam`: the Transformer schedule used by M2 and SMArT,
      lr(s) = scale * d_model^-0.5 * min(s^-0.5, s * w^-1.5),   w = 10000 warm-up steps,
  as in "Attention is all you need" and the M2 code (whose LambdaLR sees s + 1 + epoch, not s:
  docs/training.md). (Written with w^-0.5 the ramp would
  not meet s^-0.5 at s = w; the exponent is -1.5.) It peaks at scale * (d_model * w)^-0.5 at s = w:
  7.0e-4 for d = 512, w = 4000; 4.4e-4 for d = 512, w = 10000.
- `warmup-constant-decay`: PMA-Net's shape: linear warm-up to the peak lr over `warmup`
  steps, constant until `decay_start`, then multiplied by `decay_rate` every `decay_every`
  steps (never below `min_lr`).
- `constant`: the SCST phase (5e-6 in M2 and SMArT).

Optimizer: Adam (or AdamW with weight decay). PMA-Net reports LAMB, whose layer-wise trust
ratio was designed to keep very large batches stable; the configs here use the batch sizes of
M2 and SMArT (50 captions per step), where Adam with these schedules is the setting those
papers report, torch ships Adam/AdamW but no LAMB, and a hand-written optimizer would be one
more thing to get subtly wrong. docs/training.md records this choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from edgecap.errors import EdgecapError


@dataclass(frozen=True)
class Noam:
    d_model: int
    warmup: int = 10000
    scale: float = 1.0

    def __call__(self, step: int) -> float:
        s = max(1, step)
        return self.scale * self.d_model ** -0.5 * min(s ** -0.5, s * self.warmup ** -1.5)


@dataclass(frozen=True)
class WarmupConstantDecay:
    peak: float
    warmup: int = 1000
    decay_start: int = 0  # 0: no decay
    decay_every: int = 1000
    decay_rate: float = 0.8
    min_lr: float = 0.0

    def __call__(self, step: int) -> float:
        s = max(1, step)
        if self.warmup and s < self.warmup:
            return self.peak * s / self.warmup
        if self.decay_start and s >= self.decay_start:
            k = (s - self.decay_start) // self.decay_every + 1
            return max(self.min_lr, self.peak * self.decay_rate ** k)
        return self.peak


@dataclass(frozen=True)
class Constant:
    lr: float

    def __call__(self, step: int) -> float:
        return self.lr


def xe_schedule(cfg, d_model: int):
    """The XE-phase schedule of a TrainConfig."""
    s, peak = cfg.schedule, cfg.optim.lr
    if s.kind == "noam":
        return Noam(d_model, s.warmup, peak)
    if s.kind == "warmup-constant-decay":
        return WarmupConstantDecay(peak, s.warmup, s.decay_start, s.decay_every, s.decay_rate, s.min_lr)
    return Constant(peak)


def make_optimizer(name: str, params, lr: float, betas, eps: float = 1e-8, weight_decay: float = 0.0):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
    if weight_decay:
        # Adam's L2 penalty is scaled by the adaptive step; AdamW decouples it. Refuse the
        # ambiguous combination rather than pick one silently.
        raise EdgecapError("optim.weight_decay needs optimizer = \"adamw\"")
    return torch.optim.Adam(params, lr=lr, betas=tuple(betas), eps=eps)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    if not math.isfinite(lr) or lr < 0:
        raise ValueError(f"learning rate {lr}")
    for group in optimizer.param_groups:
        group["lr"] = lr
