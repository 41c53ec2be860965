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
from dataclasses import asdict, dataclass, field
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
PRECISIONS = ("fp32", "fp16", "int8")
DTYPES = ("float32", "float16", "int64", "int32", "bool", "int8", "uint8")
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
    """What a TensorRT engine was built for; an engine only runs where these match."""

    version: str
    gpu: str
    compute_capability: str  # "8.7"
    workspace_mb: int = 0
    int8_mode: str = ""  # "", "calibrator" or "qdq"
    fp32_layers: int = 0  # normalisation layers pinned to fp32 in an fp16 / int8 build

    @classmethod
    def from_dict(cls, data: dict, where: str) -> TensorRTInfo:
        return cls(
            version=_need(data, "version", str, where),
            gpu=_need(data, "gpu", str, where),
            compute_capability=_need(data, "compute_capability", str, where),
            workspace_mb=_opt(data, "workspace_mb", int, where, 0),
            int8_mode=_opt(data, "int8_mode", str, where, ""),
            fp32_layers=_opt(data, "fp32_layers", int, where, 0),
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
        return {**super().to_dict(), "top_k": self.top_k, "encode_extra_names": list(self.encode_extra_names),
                "update": self.update}

    @classmethod
    def of(cls, described: StateDescription, top_k: int, encode_extra_names=(), update: str = "host") -> DecodingState:
        return cls(described.cache, described.cross, described.layers, top_k, tuple(encode_extra_names), update)

    @property
    def cache_graph_names(self) -> list[str]:
        """The graph's cache tensors (per-layer ones once per layer)."""
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
class Manifest:
    format_version: int
    model: dict  # name, family, decoder, config (the CaptionerConfig as a dict), parameters
    input: str  # "images" (visual graph present) or "features"
    batch_size: int
    beam_size: int
    max_len: int
    vocab: Vocabulary
    preprocessing: Preprocessing | None
    decoding: DecodingDefaults
    state: DecodingState
    graphs: list[GraphEntry]
    parity: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)  # export-time graph checks (TensorRT compatibility)
    target: str = ""
    created: str = ""
    versions: dict = field(default_factory=dict)
    # RA-T: files the runtime's retriever reads (index, tokens, sha256 per file, k, length, ...)
    retrieval: dict = field(default_factory=dict)
    # real-size front end: kind, backbone, weights ("random" or a file name), weights_sha256, tokens, ...
    frontend: dict = field(default_factory=dict)
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
        model = _need(data, "model", dict, where)
        for key in ("name", "family", "decoder"):
            _need(model, key, str, f"{where}.model")
        kind = _choice(_need(data, "input", str, where), ("images", "features"), f"{where}.input")
        pre = _opt(data, "preprocessing", dict, where)
        if kind == "images" and pre is None:
            raise ManifestError(f"{where}.preprocessing: missing (an image bundle must say how to preprocess)")
        graphs = [GraphEntry.from_dict(g, f"{where}.graphs[{i}]") for i, g in enumerate(_need(data, "graphs", list, where))]
        manifest = cls(
            format_version=version,
            model=model,
            input=kind,
            batch_size=_positive(_need(data, "batch_size", int, where), f"{where}.batch_size"),
            beam_size=_positive(_need(data, "beam_size", int, where), f"{where}.beam_size"),
            max_len=_positive(_need(data, "max_len", int, where), f"{where}.max_len"),
            vocab=Vocabulary.from_dict(_need(data, "vocab", dict, where), f"{where}.vocab"),
            preprocessing=_preprocessing(pre, f"{where}.preprocessing") if pre is not None else None,
            decoding=DecodingDefaults.from_dict(_need(data, "decoding", dict, where), f"{where}.decoding"),
            state=DecodingState.from_dict(_need(data, "state", dict, where), f"{where}.state"),
            graphs=graphs,
            parity=_opt(data, "parity", dict, where, {}),
            checks=_opt(data, "checks", dict, where, {}),
            target=_opt(data, "target", str, where, ""),
            created=_opt(data, "created", str, where, ""),
            versions=_opt(data, "versions", dict, where, {}),
            retrieval=_retrieval(_opt(data, "retrieval", dict, where, {}), f"{where}.retrieval"),
            frontend=_opt(data, "frontend", dict, where, {}),
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
        extra = self.retrieval  # only the two files it names, each with its hash
        return [(e.file, e.sha256) for e in self.graphs] + [
            (extra[k], extra["sha256"][extra[k]]) for k in ("index", "tokens") if extra]

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
        # `format` first so a reader sees what the file is at a glance
        return {"format": data.pop("format"), **data}


def _retrieval(data: dict, where: str) -> dict:
    if not data:
        return {}
    for key in ("k", "length", "dim", "pad_id"):
        _need(data, key, int, where)
    hashes = _need(data, "sha256", dict, where)
    for key in ("index", "tokens"):
        name = _need(data, key, str, where)
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ManifestError(f"{where}.{key}: {name!r} is not a path inside the bundle")
        if not isinstance(hashes.get(name), str):
            raise ManifestError(f"{where}.sha256: no hash for {name!r}")
    return data


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
