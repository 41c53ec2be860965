"""PMA-Net's training extra: the prototype memory (edgecap.train.prototypes) fills its key /
value banks from every training forward and refreshes the prototypes every `stride` steps.

    [prototypes]          the PrototypeMemory options below; unset ones keep their defaults
    metrics.jsonl         a "prototypes" line per refresh (timings, bank size, prototypes set)
    last.state.pt         the banks, under "memory" (the key it has always had), for --resume
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from edgecap.train.hook import TrainingHook, register
from edgecap.train.prototypes import PrototypeMemory, check_settings


@dataclass
class PrototypeSection:
    bank_iterations: int = 1500  # T: the last T iterations' keys make a bank
    stride: int = 1500  # steps between two refreshes
    topk: int = 32  # nearest keys averaged into a prototype's value (Eq. 4)
    max_bank: int = 100_000  # token rows a layer's bank holds at most
    seed: int | None = None  # subsampling and K-Means seed; unset: [run].seed
    use_gpu: bool | None = None  # FAISS on the GPU; unset: when one is there
    kmeans_iterations: int = 25


@register("prototypes")
class PrototypeRefresh(TrainingHook):
    Config = PrototypeSection
    unused = "has no prototype memory"
    state_key = "memory"

    @classmethod
    def check(cls, config: PrototypeSection, model_cfg, where: str) -> None:
        settings = dataclasses.asdict(config)
        check_settings(f"{where}: [prototypes]", **settings)

    def setup(self, run) -> None:
        settings = {k: v for k, v in dataclasses.asdict(self.config).items() if v is not None}
        self.memory = PrototypeMemory(run.model, **{"seed": run.cfg.run.seed, **settings})

    def before_forward(self, token_mask) -> None:
        self.memory.before_forward(token_mask)

    def after_step(self, step: int) -> dict | None:
        return self.memory.after_step(step)

    def state_dict(self):
        return self.memory.state_dict()

    def load_state_dict(self, state) -> None:
        self.memory.load_state_dict(state)

    def close(self) -> None:
        self.memory.detach()
