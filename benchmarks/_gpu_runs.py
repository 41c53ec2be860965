"""What benchmarks/gpu_check.py times on one device, each behind the same call:

    runner.caption(inputs, beam) -> the best caption of every image (token tuples, up to EOS)

- `BundleRun`: an exported bundle through `edgecap.runtime.session.Bundle` on one provider, with
  its decoding state on the device (`device_state=True`, with or without CUDA graphs) or copied
  every step (`False`, the path before issue 35). Every part of a decode is timed as it runs
  (`parts`): the step graph, the cache update (the cache_update graph, or the host's slot
  write), the copies between host and device a step makes, the beam reorder; what is left of
  the decode is the host's beam search.
- `TorchRun`: edgecap's own PyTorch decoding (`models.decoding.generate`: the static-cache step,
  the shared numpy beam search) on the device.
- `OfficialRun`: the official M² code's beam search (_official_m2.py) on the device.

`peak_rates(device)` measures what the card can do in the same run (copy bandwidth, fp32 matmul
FLOP/s with TF32 off), the roofline the step is set against.
"""

from __future__ import annotations

import time

import numpy as np
from _common import Breakdown

# the parts of a device-resident step, in the order a step runs them (the first counts steps)
DEVICE_PARTS = ("step graph", "cache update", "top-k copy", "input copies", "reorder")
HOST_PARTS = ("step graph", "cache update", "reorder")  # the step graph's run includes its copies on a GPU


def best_sequences(tokens: np.ndarray, lengths: np.ndarray | None, eos: int) -> list[tuple[int, ...]]:
    """The best beam of every image up to and including EOS (tokens [B, T])."""
    out = []
    for i, row in enumerate(np.asarray(tokens).tolist()):
        n = int(lengths[i]) if lengths is not None else (row.index(eos) + 1 if eos in row else len(row))
        out.append(tuple(int(t) for t in row[:n]))
    return out


class BundleRun:
    """A bundle on one provider; `caption` runs the front end, the encoder and the beam search
    as `Captioner` does (`encode_for_decoding`: the cross tensors stay on the device)."""

    def __init__(self, bundle, max_len: int | None = None):
        self.bundle = bundle
        self.max_len = max_len or bundle.max_len
        self.parts = Breakdown(DEVICE_PARTS if bundle.device_state else HOST_PARTS)
        self.front_s, self.decode_s, self.timed_steppers = [], [], set()

    def caption(self, inputs: tuple, beam: int) -> list[tuple[int, ...]]:
        from edgecap.contract.beam import DecodeOptions

        b = self.bundle
        start = time.perf_counter()
        if b.has_visual:
            feats, mask = b.visual(inputs[0])
            extra = inputs[1:]
        else:
            feats, mask, extra = inputs[0], inputs[1], inputs[2:]
        cross = b.encode_for_decoding(feats, mask, *extra)
        middle = time.perf_counter()
        hyp = b.decode(cross, DecodeOptions(beam_size=beam, max_len=self.max_len))
        self.front_s.append(middle - start)
        self.decode_s.append(time.perf_counter() - middle)
        self._time_parts(beam)
        return best_sequences(hyp.tokens[:, 0], hyp.lengths[:, 0], b.eos_id)

    def _time_parts(self, beam: int) -> None:
        """Wrap the parts of the stepper `decode` made for this beam (once it exists)."""
        stepper = self.bundle._steppers[beam]
        if id(stepper) in self.timed_steppers:
            return
        self.timed_steppers.add(id(stepper))
        wrap = self.parts.wrap
        stepper.run = wrap("step graph", stepper.run)
        stepper.write = wrap("cache update", stepper.write)
        stepper.reorder = wrap("reorder", stepper.reorder)
        if self.bundle.device_state:
            stepper.read_top = wrap("top-k copy", stepper.read_top)
            for tensor in (stepper.token, stepper.step, stepper.parent):
                tensor.write = wrap("input copies", tensor.write)

    def reset_timing(self) -> None:
        self.parts.reset()
        self.front_s, self.decode_s = [], []

    def where_time_goes(self) -> dict:
        """Mean ms per step of each part, and of the host's search around them; the front
        end + encoder's ms per batch."""
        steps = max(1, self.parts.steps)
        per_step = {part: 1e3 * s / steps for part, s in self.parts.seconds.items()}
        decode_ms = 1e3 * sum(self.decode_s) / steps
        per_step["host search"] = decode_ms - sum(per_step.values())
        return {"per_step_ms": per_step, "step_ms": decode_ms, "steps_per_decode": steps / max(1, len(self.decode_s)),
                "front_ms": 1e3 * float(np.median(self.front_s)) if self.front_s else 0.0}


class TorchRun:
    """edgecap's PyTorch decoding on `device` (the model moved there; TF32 as the caller set it)."""

    def __init__(self, model, device: str, max_len: int):
        self.model, self.device, self.max_len = model.to(device).eval(), device, max_len

    def _features(self, inputs: tuple):
        import torch

        tensors = [torch.from_numpy(np.ascontiguousarray(x)).to(self.device) for x in inputs]
        front = 1 if getattr(self.model.visual, "takes_images", False) else 2  # images, or features + mask
        feats, mask = self.model.visual(*tensors[:front])
        return feats, mask.to(torch.bool), tuple(tensors[front:])

    def caption(self, inputs: tuple, beam: int) -> list[tuple[int, ...]]:
        import torch

        from edgecap.contract.beam import DecodeOptions
        from edgecap.models.decoding import generate

        with torch.no_grad():
            feats, mask, extra = self._features(inputs)
            hyp = generate(self.model, feats, mask, DecodeOptions(beam_size=beam, max_len=self.max_len),
                           **({"extra": extra} if extra else {}))
        return best_sequences(hyp.tokens[:, 0], hyp.lengths[:, 0], self.model.cfg.eos_id)


class OfficialRun(TorchRun):
    """The official M² code's beam search on `device` (always max_len steps, finished beams
    frozen); its captions cut at the first EOS."""

    def caption(self, inputs: tuple, beam: int) -> list[tuple[int, ...]]:
        import torch
        from _official_m2 import OfficialM2Decoding

        with torch.no_grad():
            feats, mask, _ = self._features(inputs)
            decoding = OfficialM2Decoding(self.model, beam, self.max_len)
            decoding.encode(feats, mask)
            tokens = decoding.decode().cpu().numpy()  # waits for the device
        return best_sequences(tokens, None, self.model.cfg.eos_id)


def peak_rates(device: str) -> dict:
    """The device's copy bandwidth (bytes/s, read + write) and fp32 matmul rate (FLOP/s, TF32
    off), measured now: the best of a few runs of a 1 GiB copy and an 8192^3 matmul on a GPU
    (this machine's CPU rates, as latency.py measures them, with --device cpu)."""
    import torch

    if device == "cpu":
        from _roofline import matmul_throughput, memory_bandwidth

        return {"bandwidth": memory_bandwidth(256), "flops": matmul_throughput(1024), "source": "CPU (numpy / torch)"}
    src = torch.ones(2**28, dtype=torch.float32, device=device)  # 1 GiB
    dst = torch.empty_like(src)
    n = 8192
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)

    def best(fn, repeats=5) -> float:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        return min(times)

    bandwidth = 2 * src.numel() * 4 / best(lambda: dst.copy_(src))
    flops = 2 * n**3 / best(lambda: torch.matmul(a, b))
    return {"bandwidth": bandwidth, "flops": flops, "source": f"{device} (torch, CUDA events)"}
