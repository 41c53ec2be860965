"""This training process: its place in a torchrun group and its random state.

Resuming a run bit for bit needs the RNG states of python, numpy and torch (and CUDA) saved
with the checkpoint and put back; DDP needs the rank, the world size and a barrier that is a
no-op when the run is a single process.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

# -- distributed helpers -------------------------------------------------------------------

def dist_active() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank_world() -> tuple[int, int]:
    if dist_active():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def barrier() -> None:
    if dist_active() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()


def init_distributed(device: str) -> bool:
    """Start the process group when launched by torchrun; returns True if this call started it."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist_active():
        return False
    backend = "nccl" if device.startswith("cuda") else "gloo"
    torch.distributed.init_process_group(backend=backend)
    return True


# -- RNG state -----------------------------------------------------------------------------

def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, keys, pos = state["python"][0], tuple(state["python"][1]), state["python"][2]
    random.setstate((version, keys, pos))
    kind, np_keys, np_pos, gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(np_keys, dtype=np.uint32), np_pos, gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
