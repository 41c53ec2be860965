"""PMA-Net prototypical memory during training (Algorithm 1 of Barraco et al., ICCV 2023).

Every `PrototypeAttention` layer reports the keys and values it projects from the input
tokens (its `observer`). `PrototypeMemory` keeps, per layer, a ring of per-iteration chunks
of those vectors for the last T = `bank_iterations` iterations (pad tokens dropped), and every
`stride` iterations turns each layer's bank into m prototype keys (FAISS K-Means) and values
(Eq. 4 over the top-k nearest keys, FAISS kNN), installed with `set_prototypes`.

    memory = PrototypeMemory(model, bank_iterations=1500, stride=1500, topk=32, max_bank=100_000)
    for step, batch in enumerate(batches, start=1):
        memory.before_forward(tokens != pad_id)
        loss = ...; loss.backward(); optimizer.step()
        stats = memory.after_step(step)        # None, or timings to log after a refresh

Bounding: a bank holds at most `max_bank` token rows (each row one d-dim key = h head vectors
of d/h, so the paper's T*B*h*tau head vectors are h times the rows). When the real tokens of
one iteration exceed max_bank // T, that iteration's chunk is subsampled uniformly without
replacement, with indices drawn from (seed, step), so a run and its resumed copy keep the same
rows. Subsampling each chunk, rather than reservoir sampling the stream, keeps the bank an
exact sliding window: every iteration in the window is equally represented and leaves the
bank when it leaves the window, while a reservoir keeps stale keys from a model that has
since changed.

Under torch.distributed each iteration's chunk is gathered from every rank (the bank covers
the global batch, as in the paper), rank 0 computes the prototypes and broadcasts them.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
import torch

from edgecap.errors import EdgecapError
from edgecap.models.attention.prototype import PrototypeAttention
from edgecap.train.kmeans import compute_prototypes, resolve_gpu

log = logging.getLogger(__name__)

STATE_VERSION = 1


def _dist():
    """(rank, world) when torch.distributed runs with more than one process, else None."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        if world > 1:
            return torch.distributed.get_rank(), world
    return None


def _gather_rows(rows: torch.Tensor) -> torch.Tensor:
    """Concatenate [n_r, d] from every rank in rank order (n_r may differ)."""
    dist = torch.distributed
    world = dist.get_world_size()
    count = torch.tensor([rows.shape[0]], device=rows.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    counts = [int(c) for c in counts]
    padded = rows.new_zeros((max(counts), rows.shape[1]))
    padded[: rows.shape[0]] = rows
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)])


def check_settings(where: str = "prototypes", **settings) -> None:
    """One-line errors for settings PrototypeMemory cannot run with (also checked when the
    training config is read, before any data is prepared)."""
    for name, value in settings.items():
        if name == "use_gpu":
            if value not in (None, True, False):
                raise EdgecapError(f"{where}.use_gpu={value!r}: expected true, false or unset (auto)")
        elif name != "seed" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise EdgecapError(f"{where}.{name}={value!r}: expected a positive integer")


class PrototypeMemory:
    def __init__(
        self,
        model: torch.nn.Module,
        bank_iterations: int = 1500,
        stride: int = 1500,
        topk: int = 32,
        max_bank: int = 100_000,
        seed: int = 0,
        use_gpu: bool | None = None,
        kmeans_iterations: int = 25,
    ):
        check_settings(bank_iterations=bank_iterations, stride=stride, topk=topk, max_bank=max_bank,
                       kmeans_iterations=kmeans_iterations, use_gpu=use_gpu)
        self.layers = [m for m in model.modules() if isinstance(m, PrototypeAttention)]
        if not self.layers:
            raise EdgecapError(
                "prototype memory needs a model with prototype decoder self-attention "
                "(family 'pma', decoder_self_attention='prototype'); this model has none"
            )
        self.bank_iterations, self.stride, self.topk = bank_iterations, stride, topk
        self.max_bank, self.seed, self.kmeans_iterations = max_bank, seed, kmeans_iterations
        self.gpu = resolve_gpu(use_gpu)
        self.count = self.layers[0].proto_k.shape[0]
        self.d_model = self.layers[0].d_model
        # Per layer: ring of (step, keys [n, d], values [n, d]) float32 CPU chunks.
        self.banks: list[deque] = [deque(maxlen=bank_iterations) for _ in self.layers]
        self._pending: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in self.layers]
        self._mask: torch.Tensor | None = None
        self.refreshes = 0
        self.last_step = 0
        for i, layer in enumerate(self.layers):
            layer.observer = self._observer(i)

    # -- filling the banks ------------------------------------------------------------------

    def _observer(self, index: int):
        def observe(keys: torch.Tensor, values: torch.Tensor) -> None:
            mask = self._mask
            if mask is None:
                raise RuntimeError(
                    "PrototypeMemory: a prototype layer ran in training mode before "
                    "memory.before_forward(token_mask) was called for this step"
                )
            if mask.shape != keys.shape[:2]:
                raise RuntimeError(
                    f"PrototypeMemory: token_mask {tuple(mask.shape)} does not match the layer input "
                    f"{tuple(keys.shape[:2])} [B, L]"
                )
            mask = mask.to(keys.device)
            self._pending[index].append((keys[mask].float(), values[mask].float()))

        return observe

    def before_forward(self, token_mask: torch.Tensor) -> None:
        """token_mask [B, L] bool, True for real (non-pad) input tokens of the next forward."""
        if token_mask.dim() != 2:
            raise RuntimeError(f"PrototypeMemory: token_mask must be [B, L], got {tuple(token_mask.shape)}")
        self._mask = token_mask.detach().to(torch.bool)

    def _close_chunk(self, step: int) -> None:
        """Move this iteration's observed rows into the ring, subsampled to the per-iteration quota."""
        dist = _dist()
        world = dist[1] if dist else 1
        quota = max(1, self.max_bank // (self.bank_iterations * world))
        rng = np.random.default_rng([self.seed, step, dist[0] if dist else 0])
        pick = None
        for i, pending in enumerate(self._pending):
            if pending:
                keys = torch.cat([k for k, _ in pending])
                values = torch.cat([v for _, v in pending])
            else:
                keys = values = torch.zeros(0, self.d_model)
            if pick is None and keys.shape[0] > quota:
                # Same rows in every layer: the same tokens seen at each depth.
                pick = np.sort(rng.choice(keys.shape[0], size=quota, replace=False))
            if pick is not None and keys.shape[0] > quota:
                idx = torch.from_numpy(pick).to(keys.device)
                keys, values = keys[idx], values[idx]
            if dist:
                keys, values = _gather_rows(keys), _gather_rows(values)
            if keys.shape[0]:
                self.banks[i].append((step, keys.cpu(), values.cpu()))
            pending.clear()

    # -- refreshing the prototypes ----------------------------------------------------------

    def bank_size(self) -> int:
        """Rows (token keys) in one layer's bank; every layer sees the same tokens."""
        return sum(chunk[1].shape[0] for chunk in self.banks[0])

    def after_step(self, step: int) -> dict | None:
        """Close iteration `step`; every `stride` steps refresh all layers and return timings."""
        self._close_chunk(step)
        self._mask = None
        self.last_step = step
        if step <= 0 or step % self.stride:
            return None
        return self.refresh(step)

    @torch.no_grad()
    def refresh(self, step: int) -> dict | None:
        if self.bank_size() == 0:
            return None
        dist = _dist()
        start = time.perf_counter()
        kmeans_s = knn_s = 0.0
        for i, (layer, bank) in enumerate(zip(self.layers, self.banks, strict=True)):
            if dist is None or dist[0] == 0:
                keys = torch.cat([c[1] for c in bank]).numpy()
                values = torch.cat([c[2] for c in bank]).numpy()
                # A seed per (run, step, layer): refreshes differ over time yet repeat exactly on resume.
                seed = int(np.random.default_rng([self.seed, step, i]).integers(2**31 - 1))
                protos = compute_prototypes(keys, values, self.count, self.topk, seed,
                                            self.kmeans_iterations, self.gpu)
                kmeans_s += protos.kmeans_seconds
                knn_s += protos.knn_seconds
                pk, pv = torch.from_numpy(protos.keys), torch.from_numpy(protos.values)
            else:
                pk = pv = None
            if dist:
                pk, pv = self._broadcast(layer, pk, pv)
            layer.set_prototypes(pk, pv)
        self.refreshes += 1
        stats = {
            "refresh_seconds": time.perf_counter() - start,
            "kmeans_seconds": kmeans_s,
            "knn_seconds": knn_s,
            "bank_size": self.bank_size(),
            "prototypes": int(self.layers[0].proto_valid.sum()),
        }
        log.info("PMA prototypes refreshed at step %d: %s", step, stats)
        return stats

    def _broadcast(self, layer, keys, values):
        dist = torch.distributed
        device = layer.proto_k.device if dist.get_backend() == "nccl" else torch.device("cpu")
        count = torch.tensor([0 if keys is None else keys.shape[0]], device=device)
        dist.broadcast(count, 0)
        buf = torch.zeros(2, int(count), self.d_model, device=device)
        if keys is not None:
            buf[0], buf[1] = keys, values
        dist.broadcast(buf, 0)
        return buf[0], buf[1]

    # -- resume and teardown ----------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "layers": len(self.layers),
            "d_model": self.d_model,
            "refreshes": self.refreshes,
            "last_step": self.last_step,
            "banks": [[(s, k.clone(), v.clone()) for s, k, v in bank] for bank in self.banks],
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise EdgecapError(f"prototype memory state: version {state.get('version')!r}, expected {STATE_VERSION}")
        if state["layers"] != len(self.layers) or state["d_model"] != self.d_model:
            raise EdgecapError(
                f"prototype memory state: {state['layers']} layers of d={state['d_model']}, "
                f"but the model has {len(self.layers)} of d={self.d_model}"
            )
        for bank, chunks in zip(self.banks, state["banks"], strict=True):
            bank.clear()
            bank.extend((int(s), k.float().cpu(), v.float().cpu()) for s, k, v in chunks)
        self.refreshes = int(state["refreshes"])
        self.last_step = int(state["last_step"])
        self._pending = [[] for _ in self.layers]
        self._mask = None

    def detach(self) -> None:
        """Stop observing: the layers go back to plain forward passes."""
        for layer in self.layers:
            layer.observer = None
        self._pending = [[] for _ in self.layers]
        self._mask = None
