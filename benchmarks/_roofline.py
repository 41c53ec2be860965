"""The hardware limit of one decoding step, measured on this machine in the same run.

Memory bandwidth: a large array copy (read + write), the faster of numpy's single-threaded copy
and torch's with the thread count the backends use. Matrix-multiply throughput: a square fp32
matmul in torch with that thread count. A decode step must read the weights it uses, the whole
static self-attention cache and the cross K/V, and do its FLOPs; its lower bound is
max(bytes / bandwidth, flops / throughput).
"""

from __future__ import annotations

import time

import numpy as np


def _best_seconds(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(mbytes: int = 256, repeats: int = 5, threads: int | None = None) -> float:
    """Bytes per second of a large copy (counting the read and the write), the best of numpy
    (one thread) and torch (`threads` threads): the bound must not undersell the machine."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    src = np.ones(mbytes * 2**20 // 8, dtype=np.float64)
    dst = np.empty_like(src)
    src_t, dst_t = torch.from_numpy(src), torch.from_numpy(dst)
    best = min(_best_seconds(lambda: np.copyto(dst, src), repeats), _best_seconds(lambda: dst_t.copy_(src_t), repeats))
    return 2 * src.nbytes / best


def matmul_throughput(n: int = 1024, repeats: int = 5, threads: int | None = None) -> float:
    """FLOP/s of an n x n fp32 matmul in torch."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _best_seconds(lambda: torch.matmul(a, b), repeats)


def step_cost(model, batch: int, beam: int) -> dict:
    """Bytes and FLOPs of one decode step for batch * beam rows, counted from the model itself.

    Weights read = parameters that receive a gradient from one step (so cross-attention K/V
    projections, run once per image, are not counted) plus prototype buffers; the embedding
    table counts only the rows it looks up. The cross K/V are read once per image (the beams of
    an image share them), the self-attention cache once per row. FLOPs from torch's flop counter.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    cfg = model.cfg
    rows = batch * beam
    feats = torch.randn(batch, cfg.n_regions, cfg.d_in)
    mask = torch.ones(batch, cfg.n_regions, dtype=torch.bool)
    with torch.no_grad():
        cross = model.encode(feats, mask, *model.encode_extra_example(batch))
    cache = model.init_cache(rows)
    token = torch.full((rows,), cfg.bos_id, dtype=torch.long)
    step = torch.tensor(0, dtype=torch.long)
    model.zero_grad(set_to_none=True)
    logprobs, _ = model.step(token, step, cache, cross)
    logprobs.sum().backward()
    weight_bytes = 0
    for _name, p in model.named_parameters():
        if p.grad is None:
            continue
        if isinstance(p, torch.nn.Parameter) and p.dim() == 2 and p.shape[0] == cfg.vocab_size and _name.endswith("emb.weight"):
            weight_bytes += rows * p.shape[1] * p.element_size()
        else:
            weight_bytes += p.numel() * p.element_size()
    model.zero_grad(set_to_none=True)
    weight_bytes += sum(b.numel() * b.element_size() for n, b in model.named_buffers() if "proto_" in n)
    cache_bytes = sum(t.numel() * t.element_size() for t in cache)
    cross_bytes = sum(t.numel() * t.element_size() for t in cross)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.step(token, step, cache, cross)
    return {
        "weight_bytes": weight_bytes,
        "cache_bytes": cache_bytes,
        "cross_bytes": cross_bytes,
        "bytes": weight_bytes + cache_bytes + cross_bytes,
        "flops": counter.get_total_flops(),
    }


def step_limits(cost: dict, bandwidth: float, flops_per_s: float, weight_scale: float = 1.0) -> tuple[float, float]:
    """(seconds to move the step's bytes, seconds to do its FLOPs); weight_scale: bytes per
    weight relative to fp32 (0.25 for int8 weights)."""
    moved = cost["weight_bytes"] * weight_scale + cost["cache_bytes"] + cost["cross_bytes"]
    return moved / bandwidth, cost["flops"] / flops_per_s


def step_bound_seconds(cost: dict, bandwidth: float, flops_per_s: float, weight_scale: float = 1.0) -> float:
    return max(step_limits(cost, bandwidth, flops_per_s, weight_scale))


def step_bound_kind(cost: dict, bandwidth: float, flops_per_s: float, weight_scale: float = 1.0) -> str:
    """Which limit the step bound is: "bandwidth" (bytes moved) or "compute" (FLOPs)."""
    moving, computing = step_limits(cost, bandwidth, flops_per_s, weight_scale)
    return "bandwidth" if moving >= computing else "compute"
