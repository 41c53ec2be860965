"""The bundle manifest: the one contract between `edgecap export` and the robot-side runtime.

Export constructs these dataclasses and writes them (`Manifest.to_dict`); the runtime reads
them back (`load_manifest`).

`manifest.json` is parsed into dataclasses and validated on load; a wrong or missing field is
a one-line error naming the field (e.g. `graphs[1].sha256`). Every file the runtime opens is
listed here with its sha256, and `verify_files` checks them before anything is loaded. The
schema and its version are documented in docs/bundle.md; bump FORMAT_VERSION on any change
an older runtime could misread.

Torch-free: stdlib only.
"""

from __future__ import annotations

import os
import re
import shlex
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from edgecap.contract.preprocess import CROPS, Preprocessing
from edgecap.contract.state import StateDescription
from edgecap.contract.vocab import decode_ids
from edgecap.errors import EdgecapError
from edgecap.io import sha256_file, write_json_atomic
from edgecap.jsonio import read_json

FORMAT = "edgecap-bundle"
# 2: preprocessing gained `crop` and `resize_size` (an older runtime would squash a frame the
# bundle expects centre-cropped).
# 3: the decoder step's contract (per-layer state tensors, new-slot step outputs, TopK outputs,
# cross tensors at the image batch); a version-2 step graph returns the whole cache, which this
# runtime does not drive, so versions 1 and 2 are refused with "re-export".
# 4: `state` is the model's state description (per tensor: name, batch axis, slot axis, per
# layer), no longer parallel lists of graph names and axes.
FORMAT_VERSION = 4
MANIFEST_NAME = "manifest.json"

ROLES = ("visual", "encoder", "decoder_step", "cache_update")
# graphs that run on the search rows (batch x beam) rather than on the image batch
ROW_ROLES = ("decoder_step", "cache_update")
# how the cache is updated between steps (DecodingState.update): by the runtime in place, or
# by the bundle's `cache_update` graph (slot write and beam reorder where the cache lives)
CACHE_UPDATES = ("host", "cache_update")
ENGINES = ("onnxruntime", "tensorrt")
TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt-rtx")  # edgecap.runtime.tensorrt_dist
PRECISIONS = ("fp32", "fp16", "int8")
DTYPES = ("float32", "float16", "int64", "int32", "bool", "int8", "uint8")
RANDOM_WEIGHTS = "random"  # a front end's `weights` when they are seeded random (no file)
_SHA = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(EdgecapError):
    """The manifest or a file it lists is missing, malformed or modified."""


# -- small typed readers; `where` names the field in every message ----------------------------
def _need(data: dict, key: str, kind, where: str):
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: expected an object, got {type(data).__name__}")
    if key not in data:
        raise ManifestError(f"{where}.{key}: missing")
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python; a manifest saying `"batch_size": true` is still wrong
    if isinstance(value, bool) and bool not in kinds:
        raise ManifestError(f"{where}.{key}: expected {_kind_name(kinds)}, got {value!r}")
    if not isinstance(value, kinds):
        raise ManifestError(f"{where}.{key}: expected {_kind_name(kinds)}, got {type(value).__name__} {value!r:.60}")
    return value


def _opt(data: dict, key: str, kind, where: str, default=None):
    if data.get(key) is None:
        return default
    return _need(data, key, kind, where)


def _kind_name(kinds) -> str:
    names = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object", bool: "true/false"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _choice(value: str, choices, where: str) -> str:
    if value not in choices:
        raise ManifestError(f"{where}: {value!r}, expected one of {', '.join(choices)}")
    return value


def _positive(value: int, where: str, low: int = 1) -> int:
    if value < low:
        raise ManifestError(f"{where}: {value}, expected >= {low}")
    return value


def _read(value, kind, where: str):
    """`value` as the annotation `kind` says (str, int, float, bool, Any, X | None, list[X],
    dict[str, X], a _Record), or a one-line error naming `where`."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        kind = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if isinstance(kind, type) and issubclass(kind, _Record):
        return kind.from_dict(value, where)
    if origin is dict:
        if not isinstance(value, dict):
            raise ManifestError(f"{where}: expected an object, got {type(value).__name__} {value!r:.60}")
        return {key: _read(item, args[1], f"{where}.{key}") for key, item in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ManifestError(f"{where}: expected a list, got {type(value).__name__} {value!r:.60}")
        return [_read(item, args[0], f"{where}[{i}]") for i, item in enumerate(value)]
    kinds = (int, float) if kind is float else (kind,)
    if isinstance(value, bool) is not (kind is bool) or not isinstance(value, kinds):
        raise ManifestError(f"{where}: expected {_kind_name((kind,))}, got {type(value).__name__} {value!r:.60}")
    return float(value) if kind is float else value


def _key(f) -> str:
    """A record field's key in the JSON: its name, or the `key` its metadata gives where the
    JSON's key is no Python name (`versions["tensorrt-rtx"]`)."""
    return f.metadata.get("key", f.name)


def _plain(value):
    """A record's value as JSON data."""
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


class _Record:
    """A manifest record read and written field for field, as its dataclass annotations say.

    A field that defaults to None is optional: absent from the JSON while None (and None when
    the JSON lacks it or says null). Every other field is required and always written, null
    included where its annotation allows None. Keys a record does not declare are not read. A
    field's key is its name unless its metadata names another (`_key`)."""

    @classmethod
    def from_dict(cls, data, where: str):
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: expected an object, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        values = {}
        for f in fields(cls):
            key = _key(f)
            if data.get(key) is None and (key not in data or f.default is None):
                if f.default is MISSING and f.default_factory is MISSING:
                    raise ManifestError(f"{where}.{key}: missing")
                continue
            values[f.name] = _read(data[key], hints[f.name], f"{where}.{key}")
        return cls(**values)

    def to_dict(self) -> dict:
        return {_key(f): _plain(getattr(self, f.name)) for f in fields(self)
                if not (f.default is None and getattr(self, f.name) is None)}


# -- schema --------------------------------------------------------------------------------
@dataclass
class TensorSpec:
    name: str
    shape: list[int]
    dtype: str

    @classmethod
    def from_dict(cls, data: dict, where: str) -> TensorSpec:
        shape = _need(data, "shape", list, where)
        for i, d in enumerate(shape):
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                raise ManifestError(f"{where}.shape[{i}]: {d!r}, expected a static size (integer >= 0)")
        return cls(
            name=_need(data, "name", str, where),
            shape=list(shape),
            dtype=_choice(_need(data, "dtype", str, where), DTYPES, f"{where}.dtype"),
        )


@dataclass
class TensorRTInfo:
    """What a TensorRT engine was built with and for; an engine only runs where these match."""

    version: str
    gpu: str  # the GPU it was built on ("" for TensorRT for RTX built without one)
    compute_capability: str  # "8.7": the GPU's; TensorRT for RTX: the lowest of compute_capabilities
    workspace_mb: int = 0
    int8_mode: str = ""  # "", "calibrator" or "qdq"
    fp32_layers: int = 0  # normalisation layers pinned to fp32 in an fp16 / int8 build
    distribution: str = "tensorrt"  # "tensorrt" or "tensorrt-rtx" (TensorRT for RTX)
    compute_capabilities: list[str] = field(default_factory=list)  # every one the engine runs on

    @classmethod
    def from_dict(cls, data: dict, where: str) -> TensorRTInfo:
        cc = _need(data, "compute_capability", str, where)
        ccs = _opt(data, "compute_capabilities", list, where, [cc])
        if not ccs or not all(isinstance(c, str) and re.fullmatch(r"\d+\.\d+", c) for c in ccs):
            raise ManifestError(f"{where}.compute_capabilities: {ccs!r:.60}, expected a list like [\"8.6\", \"8.9\"]")
        return cls(
            version=_need(data, "version", str, where),
            gpu=_need(data, "gpu", str, where),
            compute_capability=cc,
            workspace_mb=_opt(data, "workspace_mb", int, where, 0),
            int8_mode=_opt(data, "int8_mode", str, where, ""),
            fp32_layers=_opt(data, "fp32_layers", int, where, 0),
            distribution=_choice(_opt(data, "distribution", str, where, "tensorrt"), TENSORRT_DISTRIBUTIONS,
                                 f"{where}.distribution"),
            compute_capabilities=list(ccs),
        )


@dataclass
class GraphEntry:
    role: str  # visual | encoder | decoder_step
    file: str
    sha256: str
    engine: str  # onnxruntime | tensorrt
    precision: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opset: int = 0
    source: str = ""  # for engines: the ONNX file in this bundle they were built from
    tensorrt: TensorRTInfo | None = None

    @classmethod
    def from_dict(cls, data: dict, where: str) -> GraphEntry:
        file = _need(data, "file", str, where)
        # the runtime opens only files inside the bundle directory
        if not file or Path(file).name != file or file in (".", ".."):
            raise ManifestError(f"{where}.file: {file!r}, expected a plain file name inside the bundle")
        sha = _need(data, "sha256", str, where)
        if not _SHA.match(sha):
            raise ManifestError(f"{where}.sha256: {sha!r:.40}, expected 64 lower-case hex digits")
        engine = _choice(_need(data, "engine", str, where), ENGINES, f"{where}.engine")
        trt = _opt(data, "tensorrt", dict, where)
        if engine == "tensorrt" and trt is None:
            raise ManifestError(f"{where}.tensorrt: missing (a TensorRT engine must say what it was built for)")
        return cls(
            role=_choice(_need(data, "role", str, where), ROLES, f"{where}.role"),
            file=file,
            sha256=sha,
            engine=engine,
            precision=_choice(_need(data, "precision", str, where), PRECISIONS, f"{where}.precision"),
            inputs=[TensorSpec.from_dict(t, f"{where}.inputs[{i}]") for i, t in enumerate(_need(data, "inputs", list, where))],
            outputs=[TensorSpec.from_dict(t, f"{where}.outputs[{i}]") for i, t in enumerate(_need(data, "outputs", list, where))],
            opset=_opt(data, "opset", int, where, 0),
            source=_opt(data, "source", str, where, ""),
            tensorrt=TensorRTInfo.from_dict(trt, f"{where}.tensorrt") if trt is not None else None,
        )

    @classmethod
    def of_file(cls, role: str, file: str, root: Path, engine: str, precision: str, inputs: list, outputs: list,
                opset: int = 0, source: str = "", tensorrt: dict | TensorRTInfo | None = None) -> GraphEntry:
        """The entry of a graph or engine just written to `root / file`: hashed here, its
        fields checked as a manifest's are on load (tensors and TensorRT info may be given
        as their dict forms)."""
        trt = asdict(tensorrt) if isinstance(tensorrt, TensorRTInfo) else tensorrt
        return cls.from_dict({"role": role, "file": file, "sha256": sha256_file(Path(root) / file), "engine": engine,
                              "precision": precision, "opset": opset, "source": source, "tensorrt": trt,
                              "inputs": [_tensor_dict(t) for t in inputs], "outputs": [_tensor_dict(t) for t in outputs]},
                             f"{file} entry")

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)


def _tensor_dict(t) -> dict:
    return asdict(t) if isinstance(t, TensorSpec) else t


@dataclass
class Vocabulary:
    itos: list[str]
    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int

    @classmethod
    def from_dict(cls, data: dict, where: str) -> Vocabulary:
        itos = _need(data, "itos", list, where)
        if not itos or not all(isinstance(w, str) for w in itos):
            raise ManifestError(f"{where}.itos: expected a non-empty list of words")
        ids = {}
        for key in ("pad_id", "bos_id", "eos_id", "unk_id"):
            value = _need(data, key, int, where)
            if not 0 <= value < len(itos):
                raise ManifestError(f"{where}.{key}: {value} is outside the vocabulary (0..{len(itos) - 1})")
            ids[key] = value
        return cls(itos=list(itos), **ids)

    def decode(self, ids) -> list[str]:
        return decode_ids(ids, self.itos, self.pad_id, self.bos_id, self.eos_id)


def _preprocessing(data: dict, where: str) -> Preprocessing:
    out = []
    for key in ("mean", "std"):
        values = _need(data, key, list, where)
        if len(values) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ManifestError(f"{where}.{key}: {values!r:.60}, expected 3 numbers")
        out.append(tuple(float(v) for v in values))
    if any(s == 0 for s in out[1]):
        raise ManifestError(f"{where}.std: {list(out[1])}, expected non-zero values")
    size = _positive(_need(data, "size", int, where), f"{where}.size")
    crop = _choice(_opt(data, "crop", str, where, "none"), CROPS, f"{where}.crop")
    resize_size = _opt(data, "resize_size", int, where, size)
    if crop == "center" and resize_size < size:
        raise ManifestError(f"{where}.resize_size: {resize_size}, expected >= size {size} (it is cropped to size)")
    return Preprocessing(
        size=size,
        crop=crop,
        resize_size=resize_size,
        resize=_need(data, "resize", str, where),
        mean=out[0],
        std=out[1],
        channel_order=_choice(_need(data, "channel_order", str, where), ("RGB", "BGR"), f"{where}.channel_order"),
    )


@dataclass(frozen=True)
class DecodingState(StateDescription):
    """The model's state description (edgecap.contract.state) as the bundle's graphs take it.

    The step graph reads every cache tensor and returns, for each, `<name>.new`: the new
    position's slot along its slot axis, or the whole new tensor where that axis is null. Cross
    tensors stay at the image batch; the beams of an image are consecutive step rows. With
    `top_k` > 0 the step also returns the `top_k` best tokens of every row (top_logprobs,
    top_tokens).

    `update` says what puts each `<name>.new` into the cache and reorders the beams:
    - "host": the runtime writes the slot into its own cache in place and moves rows whose
      beam changed (the cache in host memory);
    - "cache_update": also the bundle's `cache_update` graph, which takes `step`, `parent`
      ([rows] int64: the row each row continues from), every cache tensor and its `.new` and
      returns every tensor as `<name>.next`: the slot written at `step` along the slot axis (the
      whole tensor replaced where that axis is null), then the rows gathered by `parent` along
      the batch axis. A runtime whose cache lives on a device runs it between steps with two
      cache buffers in turn (ping-pong), so the cache never leaves the device.
    The names of the graph tensors are `cache_graph_names` / `cross_graph_names` (a per-layer
    tensor once per layer, `<name>.<layer>`); `cache_names` / `cross_names` are the model's.
    """

    top_k: int = 0
    encode_extra_names: tuple[str, ...] = ()  # encoder inputs after features, mask
    update: str = "host"

    @classmethod
    def from_dict(cls, data: dict, where: str) -> DecodingState:
        try:
            described = StateDescription.from_dict(data, where)
        except EdgecapError as exc:
            raise ManifestError(str(exc)) from None
        top_k = _opt(data, "top_k", int, where, 0)
        if top_k < 0:
            raise ManifestError(f"{where}.top_k: {top_k}, expected >= 0")
        extra = _opt(data, "encode_extra_names", list, where, [])
        update = _choice(_opt(data, "update", str, where, "host"), CACHE_UPDATES, f"{where}.update")
        return cls(described.cache, described.cross, described.layers, top_k, tuple(extra), update)

    def to_dict(self) -> dict:
        # "host" is left out, as bundles exported before `update` wrote it: they read back as written
        update = {"update": self.update} if self.update != "host" else {}
        return {**super().to_dict(), "top_k": self.top_k, "encode_extra_names": list(self.encode_extra_names),
                **update}

    @classmethod
    def of(cls, described: StateDescription, top_k: int, encode_extra_names=(), update: str = "host") -> DecodingState:
        return cls(described.cache, described.cross, described.layers, top_k, tuple(encode_extra_names), update)

    # The graphs' names, a per-layer tensor once per layer ("self_k.0", "self_k.1", ...); the
    # model's names of the same tensors are StateDescription's `cache_names` / `cross_names`.
    @property
    def cache_graph_names(self) -> list[str]:
        return self.graph_names("cache")

    @property
    def cross_graph_names(self) -> list[str]:
        return self.graph_names("cross")


@dataclass
class DecodingDefaults:
    beam_size: int
    max_len: int
    length_penalty: float = 0.0

    @classmethod
    def from_dict(cls, data: dict, where: str) -> DecodingDefaults:
        return cls(
            beam_size=_positive(_need(data, "beam_size", int, where), f"{where}.beam_size"),
            max_len=_positive(_need(data, "max_len", int, where), f"{where}.max_len"),
            length_penalty=float(_opt(data, "length_penalty", (int, float), where, 0.0)),
        )


@dataclass
class ModelInfo(_Record):
    """Which captioner the bundle holds. The runtime reads none of it; tools and benchmarks do."""

    name: str
    family: str
    decoder: str
    config: dict[str, Any]  # the model's whole config as its checkpoint holds it (edgecap.models.config)
    parameters: int | None = None
    checkpoint: str | None = None  # the file name it was exported from


@dataclass
class FrontEndInt8(_Record):
    """Whether an int8 export made the convolutional front end static int8, and why
    (edgecap.export.front_int8 measures it)."""

    calibration: str  # the calibration images
    evaluation: str  # the images it was judged on
    fp32_ms: float
    int8_ms: float
    feature_cosine: float  # int8 features against fp32's
    centred_feature_cosine: float | None  # the same after removing the mean feature (None: one image)
    cosine_between_images: float | None  # fp32 features of different images (near 1: they barely differ)
    caption_agreement: float | None  # captions of the two front ends alike (None: untrained or random inputs)
    precision: str  # what the bundle's front end holds: "int8" or "fp32"
    reason: str


@dataclass
class ParityReport(_Record):
    """One engine's parity: the bundle's graphs against PyTorch on the same inputs (the export's
    gate, edgecap.export.verify), or rebuilt TensorRT engines against the bundle's onnxruntime
    graphs (edgecap.export.rebuild: `encoder_max_abs_delta`, no PyTorch)."""

    precision: str
    inputs: str  # where the inputs came from
    samples: int
    beam_identical: float  # share of inputs whose beam-search tokens are identical
    passed: bool
    random_inputs: bool | None = None
    max_abs_delta: dict[str, float] | None = None  # per graph role, on PyTorch's inputs
    feature_cosine: dict[str, float] | None = None  # per graph role, the worst batch
    feature_scale: float | None = None  # the largest |feature| (visual graphs: the fp32 bound scales with it)
    criteria: str | None = None  # what the gate checked, in words
    tolerance: dict[str, float] | None = None  # per role, as the export spec states it
    tolerance_checked: dict[str, float] | None = None  # per role, the bound max_abs_delta met
    greedy_identical: float | None = None
    greedy_ties: int | None = None  # inputs whose captions differ only by a near-tie rounding broke
    beam_ties: int | None = None  # the same for beam captions (edgecap.export.verify)
    visual_beam_identical: float | None = None  # the bundle's features through PyTorch's decoder
    beam_size: int | None = None
    cider_references: str | None = None  # "dataset", or "pytorch captions" when the inputs have none
    cider_pytorch: float | None = None
    cider_bundle: float | None = None
    cider_delta: float | None = None
    distinct_captions: int | None = None
    one_caption_for_all: bool | None = None  # then "identical" says nothing about the model
    quantize: str | None = None  # int8: which quantization (onnxruntime's mode, TensorRT's int8 mode)
    front_end_int8: FrontEndInt8 | None = None
    encoder_max_abs_delta: float | None = None  # a rebuild: engines against the onnxruntime graphs

    @property
    def ran(self) -> bool:
        """The gate ran (ParityNotRun's is False); not a key of the JSON."""
        return True


@dataclass
class ParityNotRun(_Record):
    """An engine's parity where the exporting machine could not run its engines (TensorRT for
    RTX builds without a GPU, or on one they are not built for): no verdict, and why. Written as
    `{"precision", "ran": false, "reason"}`; `parity_record` tells the two records apart by `ran`."""

    precision: str
    reason: str  # why the engines could not run here, in words
    ran: bool = False

    @classmethod
    def from_dict(cls, data, where: str) -> ParityNotRun:
        record = super().from_dict(data, where)
        if record.ran:
            raise ManifestError(f"{where}.ran: true, expected false (a report that ran carries its verdict)")
        return record


def parity_record(data, where: str) -> ParityReport | ParityNotRun:
    """One engine's parity as the manifest holds it: `"ran": false` is ParityNotRun, anything
    else the gate's ParityReport (bundles before TensorRT for RTX have no `ran`)."""
    cls = ParityNotRun if isinstance(data, dict) and data.get("ran") is False else ParityReport
    return cls.from_dict(data, where)


@dataclass
class GraphCheck(_Record):
    """What TensorRT would make of one ONNX graph of the bundle (edgecap.export.compat)."""

    tensorrt_compatible: bool
    problems: list[str]
    # which judge ruled: "TensorRT for RTX 1.7.1.116's ONNX parser", or edgecap's op list where
    # no TensorRT imports (absent in bundles exported before the parser judged)
    checked_by: str | None = None


@dataclass
class Versions(_Record):
    """The versions that made the bundle; a package that was not installed is absent. The
    TensorRT distributions (edgecap.runtime.tensorrt_dist) are their modules' `__version__`s,
    keyed by distribution name: `tensorrt`, and `tensorrt-rtx` for TensorRT for RTX."""

    python: str
    edgecap: str | None = None
    torch: str | None = None
    onnx: str | None = None
    onnxruntime: str | None = None
    onnxscript: str | None = None
    tensorrt: str | None = None
    tensorrt_rtx: str | None = field(default=None, metadata={"key": "tensorrt-rtx"})


@dataclass
class CoverageVectors(_Record):
    """Coverage's word vectors for this bundle's vocabulary and the class names
    (edgecap.metrics.subset), so a robot loads a few hundred kB instead of the whole GloVe table."""

    vectors: str  # path inside the bundle (.npz)
    sha256: str
    words: int

    @classmethod
    def from_dict(cls, data, where: str) -> CoverageVectors:
        entry = super().from_dict(data, where)
        if Path(entry.vectors).is_absolute() or ".." in Path(entry.vectors).parts:
            raise ManifestError(f"{where}.vectors: {entry.vectors!r} is not a path inside the bundle")
        return entry

    def files(self) -> list[tuple[str, str]]:
        return [(self.vectors, self.sha256)]


@dataclass
class RetrievalAssets(_Record):
    """RA-T: the files the runtime's retriever reads (a FAISS index of the training images and
    their captions as token ids), each with its sha256, and how to read them."""

    index: str  # path inside the bundle
    tokens: str  # path inside the bundle: [count, length] int64
    k: int  # captions retrieved per image
    length: int  # tokens per caption
    dim: int  # embedding width
    pad_id: int
    sha256: dict[str, str]  # per file above
    kind: str | None = None  # index kind: "flat" or "hnsw"
    count: int | None = None  # images indexed
    embedding: dict[str, Any] | None = None  # what made the index's embeddings

    @classmethod
    def from_dict(cls, data, where: str) -> RetrievalAssets:
        assets = super().from_dict(data, where)
        for key in ("index", "tokens"):
            name = getattr(assets, key)
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ManifestError(f"{where}.{key}: {name!r} is not a path inside the bundle")
            if name not in assets.sha256:
                raise ManifestError(f"{where}.sha256: no hash for {name!r}")
        return assets

    def files(self) -> list[tuple[str, str]]:
        return [(self.index, self.sha256[self.index]), (self.tokens, self.sha256[self.tokens])]


@dataclass
class FrontEndInfo(_Record):
    """A real-size front end in the visual graph: which backbone and which weights."""

    kind: str  # "open_clip" or "torchvision"
    backbone: str
    weights: str  # the weights' file name, or RANDOM_WEIGHTS
    weights_sha256: str
    tokens: str  # what its feature tokens are, in words
    grid: int  # tokens per image
    width: int  # channels per token
    parameters: int

    @property
    def random_weights(self) -> bool:
        """Seeded random weights: the bundle's captions say nothing about a scene."""
        return self.weights == RANDOM_WEIGHTS


@dataclass
class Manifest:
    format_version: int
    model: ModelInfo
    input: str  # "images" (visual graph present) or "features"
    batch_size: int
    beam_size: int
    max_len: int
    vocab: Vocabulary
    preprocessing: Preprocessing | None
    decoding: DecodingDefaults
    state: DecodingState
    graphs: list[GraphEntry]
    # per engine ("onnxruntime", "tensorrt"); ParityNotRun where the engines could not run
    parity: dict[str, ParityReport | ParityNotRun] = field(default_factory=dict)
    checks: dict[str, GraphCheck] = field(default_factory=dict)  # per ONNX file, at export
    target: str = ""
    created: str = ""
    # The optional records below are written as {} when absent, as they always were.
    versions: Versions | None = None
    retrieval: RetrievalAssets | None = None  # RA-T's retrieval files
    frontend: FrontEndInfo | None = None  # a real-size front end's provenance
    coverage: CoverageVectors | None = None  # coverage's word vectors for this vocabulary
    format: str = FORMAT

    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST_NAME) -> Manifest:
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: expected a JSON object, got {type(data).__name__}")
        fmt = data.get("format")
        if fmt != FORMAT:
            raise ManifestError(f"{where}: format {fmt!r}, expected {FORMAT!r} (not an edgecap bundle)")
        version = _need(data, "format_version", int, where)
        if version != FORMAT_VERSION:
            newer = "re-export it with this edgecap version" if version < FORMAT_VERSION else "upgrade edgecap on this machine"
            raise ManifestError(
                f"{where}.format_version: {version}, this runtime reads version {FORMAT_VERSION} ({newer})"
            )
        kind = _choice(_need(data, "input", str, where), ("images", "features"), f"{where}.input")
        pre = _opt(data, "preprocessing", dict, where)
        if kind == "images" and pre is None:
            raise ManifestError(f"{where}.preprocessing: missing (an image bundle must say how to preprocess)")
        graphs = [GraphEntry.from_dict(g, f"{where}.graphs[{i}]") for i, g in enumerate(_need(data, "graphs", list, where))]
        manifest = cls(
            format_version=version,
            model=ModelInfo.from_dict(_need(data, "model", dict, where), f"{where}.model"),
            input=kind,
            batch_size=_positive(_need(data, "batch_size", int, where), f"{where}.batch_size"),
            beam_size=_positive(_need(data, "beam_size", int, where), f"{where}.beam_size"),
            max_len=_positive(_need(data, "max_len", int, where), f"{where}.max_len"),
            vocab=Vocabulary.from_dict(_need(data, "vocab", dict, where), f"{where}.vocab"),
            preprocessing=_preprocessing(pre, f"{where}.preprocessing") if pre is not None else None,
            decoding=DecodingDefaults.from_dict(_need(data, "decoding", dict, where), f"{where}.decoding"),
            state=DecodingState.from_dict(_need(data, "state", dict, where), f"{where}.state"),
            graphs=graphs,
            parity={engine: parity_record(report, f"{where}.parity.{engine}")
                    for engine, report in _opt(data, "parity", dict, where, {}).items()},
            checks=_read(_opt(data, "checks", dict, where, {}), dict[str, GraphCheck], f"{where}.checks"),
            target=_opt(data, "target", str, where, ""),
            created=_opt(data, "created", str, where, ""),
            versions=_optional_record(Versions, data, "versions", where),
            retrieval=_optional_record(RetrievalAssets, data, "retrieval", where),
            frontend=_optional_record(FrontEndInfo, data, "frontend", where),
            coverage=_optional_record(CoverageVectors, data, "coverage", where),
        )
        manifest._check_graphs(where)
        manifest._check_vocab_fits_decoder(where)
        return manifest

    def _check_vocab_fits_decoder(self, where: str) -> None:
        """The decoder step scores one token per vocabulary word: a vocabulary of another size
        (a manifest edited, or put beside another export's graphs) would turn token ids into
        wrong words, or into an IndexError mid-run, so it is refused when the bundle opens."""
        words = len(self.vocab.itos)
        for g in self.graphs:
            scores = next((t for t in g.outputs if t.name == "logprobs"), None) if g.role == "decoder_step" else None
            if scores is not None and scores.shape and scores.shape[-1] != words:
                raise ManifestError(f"{where}.vocab: {words} words, but {g.file} scores {scores.shape[-1]} tokens "
                                    f"per step (output 'logprobs' {scores.shape}); the vocabulary and the graph "
                                    "come from different exports")

    def _check_graphs(self, where: str) -> None:
        needed = ("encoder", "decoder_step") + (("visual",) if self.input == "images" else ()) + (
            ("cache_update",) if self.state.update == "cache_update" else ())
        for role in needed:
            if not any(g.role == role and g.engine == "onnxruntime" for g in self.graphs):
                raise ManifestError(f"{where}.graphs: no onnxruntime entry for the {role!r} graph")
        if self.input == "features" and any(g.role == "visual" for g in self.graphs):
            raise ManifestError(f"{where}.graphs: a 'visual' graph in a bundle whose input is 'features'")
        if self.state.update != "cache_update" and any(g.role == "cache_update" for g in self.graphs):
            raise ManifestError(f"{where}.graphs: a 'cache_update' graph, but state.update is "
                                f"{self.state.update!r}, not 'cache_update'")
        seen = set()
        for g in self.graphs:
            if (g.role, g.engine) in seen:
                raise ManifestError(f"{where}.graphs: two {g.engine} entries for the {g.role!r} graph")
            seen.add((g.role, g.engine))
            if g.engine == "tensorrt" and g.source and not any(s.file == g.source for s in self.graphs):
                raise ManifestError(f"{where}.graphs: engine {g.file} names source {g.source!r}, which is not listed")

    def files(self) -> list[tuple[str, str]]:
        """(file, sha256) of every file the bundle carries besides manifest.json."""
        return ([(e.file, e.sha256) for e in self.graphs] + (self.retrieval.files() if self.retrieval else [])
                + (self.coverage.files() if self.coverage else []))

    def graph(self, role: str, engine: str = "onnxruntime") -> GraphEntry | None:
        return next((g for g in self.graphs if g.role == role and g.engine == engine), None)

    def write(self, root: Path) -> Manifest:
        """Write `root / manifest.json` atomically, after checking that it reads back as
        written (the checks a runtime makes on load)."""
        data = self.to_dict()
        Manifest.from_dict(data, where=f"{Path(root).name}/{MANIFEST_NAME}")
        write_json_atomic(Path(root) / MANIFEST_NAME, data)
        return self

    def to_dict(self) -> dict:
        pre = self.preprocessing
        data = {**asdict(self), "state": self.state.to_dict(), "preprocessing": None if pre is None else pre.to_dict()}
        data.update({name: _plain(getattr(self, name)) for name in ("model", "parity", "checks")})
        data.update({name: _plain(getattr(self, name)) or {} for name in ("versions", "retrieval", "frontend")})
        if self.coverage is None:  # newer than the others: absent, not {}, so older bundles read back as written
            del data["coverage"]
        else:
            data["coverage"] = self.coverage.to_dict()
        # `format` first so a reader sees what the file is at a glance
        return {"format": data.pop("format"), **data}


def _optional_record(cls, data: dict, key: str, where: str):
    """A record the manifest holds as {} when there is none (-> None)."""
    table = _opt(data, key, dict, where, {})
    return cls.from_dict(table, f"{where}.{key}") if table else None


# -- files ------------------------------------------------------------------------------------
def read_manifest(bundle_dir: str | os.PathLike) -> Manifest:
    root = Path(bundle_dir)
    if root.is_file() and root.suffix in (".pt", ".pth"):
        raise ManifestError(f"{root} is a checkpoint, not a bundle: export it first "
                            f"(edgecap export {shlex.quote(str(root))} --target cpu-ort-fp32 --out BUNDLE_DIR)")
    if not root.exists():
        raise ManifestError(f"bundle {root} does not exist: a bundle is the folder `edgecap export "
                            "CHECKPOINT --out DIR` writes (`edgecap demo` leaves one in demo-out/bundle)")
    if not root.is_dir():
        raise ManifestError(f"bundle {root} is not a directory")
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(f"bundle {root} has no {MANIFEST_NAME} (export one with `edgecap export`)")
    try:  # a manifest saved again by an editor may carry a byte order mark (Notepad)
        data = read_json(path)
    except EdgecapError as exc:
        raise ManifestError(str(exc)) from None
    return Manifest.from_dict(data, where=str(path))


def verify_files(bundle_dir: str | os.PathLike, manifest: Manifest) -> None:
    """Check every listed file exists and has its recorded sha256."""
    root = Path(bundle_dir)
    for file, sha256 in manifest.files():
        path = root / file
        if not path.is_file():
            raise ManifestError(f"bundle {root}: {file} is listed in {MANIFEST_NAME} but missing")
        actual = sha256_file(path)
        if actual != sha256:
            raise ManifestError(
                f"bundle {root}: {file} has sha256 {actual[:12]}..., the manifest says "
                f"{sha256[:12]}... (modified after export; re-export the bundle)"
            )


def load_manifest(bundle_dir: str | os.PathLike, verify: bool = True) -> Manifest:
    manifest = read_manifest(bundle_dir)
    if verify:
        verify_files(bundle_dir, manifest)
    return manifest
