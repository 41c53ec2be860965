"""The shared part of every export spec: three graphs over the CaptionModel interface (models/captioner.py).

    visual        images [B, 3, H, W] float32            -> features [B, N, D_in], mask [B, N] bool
    encoder       features [B, N, D_in], mask [B, N], and the model's extra encode inputs
                  (`encode_extra_names`, e.g. RA-T's retrieved captions) -> the cross tensors
    decoder_step  token [R] int64, step [] int64, cache tensors [R, ...], cross tensors [B, ...]
                  -> logprobs [R, V], top_logprobs / top_tokens [R, K] (TopK: the K best tokens of
                     every row, ties to the lower id), and per cache tensor its new slot

    cache_update  step [] int64, parent [R] int64, cache tensors, their `.new` slots
                  -> per cache tensor `<name>.next`: the slot written at `step`, then the rows
                     gathered by `parent` (no weights: what a device-resident runtime runs
                     between steps so the cache never leaves the device)

with B = batch, K = beam and R = B * K (the beams of an image consecutive). A tensor the model
stacks per decoder layer (cache fields, cross K/V) is a separate graph tensor per layer,
`<name>.<layer>`: onnxruntime copies any slice of a graph input, so a stacked input would be
copied every step. The step returns only what changed, `<cache name>.new`: the new position's
slot (the runtime writes it in place, along the slot axis the model's state description gives)
or, for a recurrent state, the whole new state. The manifest's `state` is that description
(edgecap.contract.state), written as the model declares it. A subclass (one per decoder kind) sets the tolerances and declares
inputs its step graph does not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from edgecap.contract.manifest import FrontEndInfo
from edgecap.contract.preprocess import Preprocessing
from edgecap.contract.state import CACHE_NEXT_SUFFIX, CACHE_OUT_SUFFIX
from edgecap.errors import EdgecapError
from edgecap.models.frontends import FrontEnd, provenance, weights_label
from edgecap.models.registry import Registry

TOKEN, STEP, LOGPROBS = "token", "step", "logprobs"
TOP_LOGPROBS, TOP_TOKENS = "top_logprobs", "top_tokens"
PARENT = "parent"
# name (a model's `export_spec`) -> spec class; every module of this package registers its own
EXPORT_SPECS = Registry("export spec", ("edgecap.export.specs",))


def split_layers(tensors, described) -> list:
    """Stacked tensors -> the graph's flat list (per-layer ones one tensor per layer)."""
    out = []
    for tensor, d in zip(tensors, described, strict=True):
        out.extend(tensor.unbind(0) if d.per_layer else [tensor])
    return out


def join_layers(flat, described, layers: int) -> tuple:
    """The graph's flat list -> one entry per model tensor (a list of layers where per
    layer); the model indexes a list by layer as it indexes a stacked tensor."""
    out, i = [], 0
    for d in described:
        out.append(list(flat[i:i + layers]) if d.per_layer else flat[i])
        i += layers if d.per_layer else 1
    return tuple(out)


@dataclass
class GraphSpec:
    role: str
    module: nn.Module
    input_names: list[str]
    output_names: list[str]
    dummy_inputs: tuple[torch.Tensor, ...]
    atol: float  # largest fp32 |onnxruntime - PyTorch| accepted on any output
    unused_inputs: tuple[str, ...] = field(default_factory=tuple)  # the exporter may drop these


class _Visual(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, images):
        feats, mask = self.model.visual(images)
        return feats, mask.to(torch.bool)


class _Encoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, feats, mask, *extra):
        return tuple(split_layers(self.model.encode(feats, mask, *extra), self.model.state.cross))


class _Step(nn.Module):
    def __init__(self, model, top_k: int):
        super().__init__()
        self.model = model
        self.top_k = top_k
        self.n_cache = len(model.state.graph_names("cache"))

    def forward(self, token, step, *tensors):
        m = self.model
        described = m.state
        cache = join_layers(tensors[: self.n_cache], described.cache, described.layers)
        cross = join_layers(tensors[self.n_cache:], described.cross, described.layers)
        logprobs, new = m.step(token, step, cache, cross)
        top, tokens = torch.topk(logprobs, self.top_k, dim=-1)
        return (logprobs, top, tokens, *[t for per_layer in new for t in per_layer])


class _CacheUpdate(nn.Module):
    """The cache for the next step, in the rows' new order: each tensor's new slot written at
    `step` along its slot axis (the whole tensor replaced where it has none), then its rows
    gathered by `parent` along its batch axis. Data movement only: no weights, no arithmetic,
    so every precision of a bundle shares this fp32 graph."""

    def __init__(self, tensors):
        super().__init__()
        self.tensors = tensors  # one StateTensor per graph cache tensor, in the step's order

    def forward(self, step, parent, *tensors):
        n = len(self.tensors)
        out = []
        for described, cache, new in zip(self.tensors, tensors[:n], tensors[n:], strict=True):
            if described.slot_axis is None:
                written = new
            else:
                axis = described.slot_axis
                shape = [1] * cache.dim()
                shape[axis] = cache.shape[axis]
                hit = (torch.arange(cache.shape[axis]) == step).view(shape)  # broadcasts the [.., 1, ..] slot
                written = torch.where(hit, new, cache)
            out.append(written.index_select(described.batch_axis, parent))
        return tuple(out)


def new_slot_shape(shape, slot_axis: int | None) -> list[int]:
    """The shape of a cache tensor's `.new` output: one slot along the slot axis, or the whole
    tensor where it has none."""
    out = list(shape)
    if slot_axis is not None:
        out[slot_axis] = 1
    return out


class ExportSpec:
    """What to export for one model at a static (batch, beam)."""

    visual_atol = 1e-3
    encoder_atol = 1e-4
    step_atol = 1e-4
    step_unused_inputs: tuple[str, ...] = ()

    def __init__(self, model, batch: int, beam: int):
        self.model = model.eval()
        self.cfg = model.cfg
        self.batch, self.beam = batch, beam
        self.rows = batch * beam
        self.extra_names = tuple(getattr(model, "encode_extra_names", ()))
        cache = model.init_cache(1)
        if any(bool(t.any()) for t in cache):
            raise EdgecapError(f"model {self.cfg.name!r}: init_cache is not all zeros; bundles start the cache at zeros")
        self.top_k = min(beam, self.cfg.vocab_size)

    # -- what the bundle says about the model ----------------------------------------------------
    @property
    def takes_images(self) -> bool:
        return bool(getattr(self.model.visual, "takes_images", False))

    def flat_cross(self, cross) -> list:
        """The model's cross tensors as the encoder graph outputs them (layers apart)."""
        return split_layers(cross, self.model.state.cross)

    def preprocessing(self) -> Preprocessing | None:
        if not self.takes_images:
            return None
        return Preprocessing.from_mapping(self.cfg.visual.preprocessing())

    def frontend(self) -> FrontEndInfo | None:
        """The manifest's `frontend` record for a real-size front end (None for the others):
        which backbone, which weights ("random" when seeded random), what its tokens are."""
        visual = self.model.visual
        if not isinstance(visual, FrontEnd):
            return None
        vc = self.cfg.visual
        made = provenance(vc, self.cfg.n_regions, self.cfg.d_in) if not vc.weights or vc.weights_sha256 else {}
        return FrontEndInfo(kind=vc.kind, backbone=vc.backbone, weights=weights_label(vc),
                            weights_sha256=made.get("weights_sha256", ""), tokens=type(visual).describe(vc.backbone),
                            grid=self.cfg.n_regions, width=self.cfg.d_in,
                            parameters=sum(p.numel() for p in visual.parameters()))

    def assets(self, root, vocab) -> dict | None:
        """Write extra files the runtime needs into the bundle directory `root`; -> the
        manifest's `retrieval` section (files listed under "index" / "tokens"), or None."""
        return None

    def tolerances(self) -> dict[str, float]:
        out = {"visual": self.visual_atol} if self.takes_images else {}
        return {**out, "encoder": self.encoder_atol, "decoder_step": self.step_atol}

    # -- inputs ------------------------------------------------------------------------------
    def random_inputs(self, n: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """n deterministic model inputs: images [n,3,H,W], or (features [n,N,D], mask [n,N]),
        followed by the model's extra encode inputs (its own examples)."""
        return self.front_inputs(n, seed) + self.extra_inputs(n)

    def extra_inputs(self, n: int) -> tuple[torch.Tensor, ...]:
        if not self.extra_names:
            return ()
        return tuple(self.model.encode_extra_example(n))

    def split(self, inputs: tuple[torch.Tensor, ...]) -> tuple[tuple, tuple]:
        """Model inputs -> (visual front-end inputs, extra encode inputs)."""
        k = len(self.extra_names)
        return (tuple(inputs[:-k]), tuple(inputs[-k:])) if k else (tuple(inputs), ())

    def front_inputs(self, n: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        if self.takes_images:
            size = self.cfg.visual.image_size
            return (torch.randn(n, 3, size, size, generator=g),)
        feats = torch.randn(n, self.cfg.n_regions, self.cfg.d_in, generator=g)
        mask = torch.ones(n, self.cfg.n_regions, dtype=torch.bool)
        # some images with padded regions, so the mask path is exercised
        lengths = torch.randint(max(1, self.cfg.n_regions // 2), self.cfg.n_regions + 1, (n,), generator=g)
        mask &= torch.arange(self.cfg.n_regions)[None, :] < lengths[:, None]
        return feats, mask

    @torch.no_grad()
    def features(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        feats, mask = self.model.visual(*self.split(inputs)[0])
        return feats, mask.to(torch.bool)

    # -- graphs --------------------------------------------------------------------------------
    @torch.no_grad()
    def graphs(self) -> list[GraphSpec]:
        inputs = self.random_inputs(self.batch)
        front, extra = self.split(inputs)
        feats, mask = self.features(inputs)
        out = []
        if self.takes_images:
            out.append(GraphSpec("visual", _Visual(self.model).eval(), ["images"], ["features", "mask"], front,
                                 self.visual_atol))
        out.append(GraphSpec("encoder", _Encoder(self.model).eval(), ["features", "mask", *self.extra_names],
                             self.model.state.graph_names("cross"), (feats, mask, *extra), self.encoder_atol))
        out.append(self.step_graph(feats, mask, extra))
        out.append(self.cache_update_graph())
        return out

    def step_graph(self, feats, mask, extra=()) -> GraphSpec:
        m = self.model
        cross = self.flat_cross(m.encode(feats, mask, *extra))
        cache = split_layers(m.init_cache(self.rows), m.state.cache)
        token = torch.full((self.rows,), self.cfg.bos_id, dtype=torch.long)
        step = torch.tensor(0, dtype=torch.long)
        cache_names = m.state.graph_names("cache")
        return GraphSpec(
            "decoder_step", _Step(m, self.top_k).eval(),
            [TOKEN, STEP, *cache_names, *m.state.graph_names("cross")],
            [LOGPROBS, TOP_LOGPROBS, TOP_TOKENS, *(n + CACHE_OUT_SUFFIX for n in cache_names)],
            (token, step, *cache, *cross),
            self.step_atol,
            unused_inputs=self.step_unused_inputs,
        )

    def cache_update_graph(self) -> GraphSpec:
        m = self.model
        tensors = m.state.graph_tensors("cache")
        cache = split_layers(m.init_cache(self.rows), m.state.cache)
        new = [torch.zeros(new_slot_shape(c.shape, t.slot_axis), dtype=c.dtype) for c, t in zip(cache, tensors, strict=True)]
        names = [t.name for t in tensors]
        # a tensor replaced whole (an LSTM's state) is never read, only its new value; a graph
        # of only such tensors never reads `step` either
        whole = tuple(t.name for t in tensors if t.slot_axis is None)
        unused = whole + ((STEP,) if len(whole) == len(tensors) else ())
        return GraphSpec(
            "cache_update", _CacheUpdate(tensors).eval(),
            [STEP, PARENT, *names, *(n + CACHE_OUT_SUFFIX for n in names)],
            [n + CACHE_NEXT_SUFFIX for n in names],
            (torch.tensor(0, dtype=torch.long), torch.arange(self.rows), *cache, *new),
            0.0,
            unused_inputs=unused,
        )
