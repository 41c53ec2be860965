"""Graph runners behind `Bundle`: onnxruntime sessions and native TensorRT engines.

Both expose the same calls, so the bundle and its steppers never ask which one they hold:
    runner.run(feeds) -> list of numpy outputs (manifest order)
    run = runner.bind(inputs, outputs)   # persistent numpy buffers, bound once
    run()                                # reads the inputs' current contents, writes the outputs
and, for state that lives where the graph runs (`runner.memory`: "cuda", "cpu", or None where
edgecap cannot hold tensors for the provider):
    tensor = runner.tensor(shape, dtype)  # allocated once in the graph's memory
    tensor.write(array); tensor.read()    # the only host <-> device copies, made by the caller
    run = runner.bind_tensors(inputs, outputs, capture=True)   # bound once; run() runs it
    runner.run_into(feeds, outputs)       # numpy feeds in, outputs left in `tensor`s
With `capture`, a runner opened with CUDA graphs records the bound run as a CUDA graph once
and replays it afterwards (fixed addresses, inputs updated in place by `write`); every binding
gets its own graph, so the two ping-pong sides of a stepper and the steppers of two beam sizes
never replay each other's.
On onnxruntime's CPU provider `bind` is zero-copy IO binding, made once: the graph reads the
caller's arrays (the decoder's cache, the cross tensors) where they are and writes its outputs
into the caller's arrays, so a decoding step moves no tensor it does not compute.
Feeds are checked against the manifest's static shapes and dtypes first, so a wrong batch is a
one-line error naming the tensor instead of an onnxruntime stack trace. Torch-free; TensorRT
(`tensorrt` or `tensorrt_rtx`, as the engine's manifest entry says) and cuda-python are imported
only when an engine is opened.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgecap.contract.manifest import GraphEntry, ManifestError
from edgecap.errors import EdgecapError, did_you_mean, require
from edgecap.io import atomic_path
from edgecap.runtime.tensorrt_dist import (
    DISTRIBUTIONS,
    RTX_RELEASES,
    TENSORRT,
    TENSORRT_RTX,
    Distribution,
    installed,
    trt_apis,
)
from edgecap.runtime.tensorrt_dist import load as load_distribution

PREFERRED_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


def default_providers() -> list[str]:
    """The best installed onnxruntime providers, CPU last as the fallback for unsupported ops."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    return [p for p in PREFERRED_PROVIDERS if p in available] or ["CPUExecutionProvider"]


def provider_name(provider) -> str:
    """A provider as onnxruntime takes it: a name, or (name, {option: value})."""
    return provider[0] if isinstance(provider, tuple) else provider


def check_providers(requested: list) -> list:
    """Providers a user named (names, or (name, options) pairs as onnxruntime takes them): each
    must be one this onnxruntime build has, else a one-line error. Nothing is silently dropped:
    asking for CUDA and getting CPU is a wrong robot."""
    import onnxruntime as ort

    if not requested:
        raise EdgecapError("--providers is empty: name at least one onnxruntime execution provider")
    available = ort.get_available_providers()
    for name in map(provider_name, requested):
        if name in available:
            continue
        have = f"this onnxruntime {ort.__version__} has {', '.join(available)}"
        if name not in ort.get_all_providers():
            prefix = [p for p in available if p.lower().startswith(name.lower())]
            hint = f" (did you mean {prefix[0]!r}?)" if prefix else did_you_mean(name, available)
            raise EdgecapError(f"unknown onnxruntime execution provider {name!r}{hint}; {have}")
        raise EdgecapError(f"execution provider {name} is not available: {have} (for GPUs install "
                           f"onnxruntime-gpu: pip install \"edgecap[gpu]\"; or leave providers unset)")
    return list(requested)


_said: set[str] = set()


def say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)

        print(f"edgecap: {message}", file=sys.stderr, flush=True)


def check_feeds(entry: GraphEntry, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds the graph takes, in its dtypes; a wrong shape or a missing tensor raises."""
    out = {}
    for spec in entry.inputs:
        if spec.name not in feeds:
            raise EdgecapError(f"{entry.file}: input {spec.name!r} not given")
        value = np.asarray(feeds[spec.name])
        if list(value.shape) != spec.shape:
            raise EdgecapError(
                f"{entry.file}: input {spec.name!r} has shape {list(value.shape)}, the graph was "
                f"exported for {spec.shape} (static shapes: pad the batch)"
            )
        out[spec.name] = np.asarray(value, dtype=np.dtype(spec.dtype), order="C")  # keeps 0-d arrays 0-d
    return out


# onnxruntime's element type names -> the manifest's dtypes
_ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
               "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(int8)": "int8", "tensor(uint8)": "uint8"}


def check_graph_io(session, entry: GraphEntry, path: Path) -> None:
    """The graph must declare the inputs and outputs its manifest entry lists (names, dtypes,
    and every static size), else a one-line error at load instead of an onnxruntime failure
    at the first frame: the sha256 only proves the file is the one recorded, not that the
    record describes it."""
    for kind, declared, listed in (("input", session.get_inputs(), entry.inputs),
                                   ("output", session.get_outputs(), entry.outputs)):
        graph = {t.name: t for t in declared}
        for spec in listed:
            node = graph.get(spec.name)
            if node is None:
                raise ManifestError(f"{path}: the graph has no {kind} {spec.name!r} that manifest.json lists "
                                    f"(its {kind}s: {', '.join(graph)}); the file does not belong to this bundle")
            dtype = _ORT_DTYPES.get(node.type, node.type)
            sizes_differ = len(node.shape) != len(spec.shape) or any(
                isinstance(d, int) and d != want for d, want in zip(node.shape, spec.shape, strict=False))
            if dtype != spec.dtype or sizes_differ:
                raise ManifestError(f"{path}: {kind} {spec.name!r} is {dtype} {list(node.shape)} in the graph, "
                                    f"manifest.json says {spec.dtype} {spec.shape}; the file does not belong to "
                                    f"this bundle")
        extra = [name for name in graph if name not in {t.name for t in listed}]
        if kind == "input" and extra:
            raise ManifestError(f"{path}: the graph takes input {extra[0]!r}, which manifest.json does not list; "
                                f"the file does not belong to this bundle")


# providers whose tensors live in CUDA device memory, and their CUDA-graph option
CUDA_GRAPH_OPTIONS = {"CUDAExecutionProvider": "enable_cuda_graph", "TensorrtExecutionProvider": "trt_cuda_graph_enable"}


def with_cuda_graphs(providers: list) -> list:
    """The providers with CUDA-graph capture turned on for every one that has it."""
    out = []
    for provider in providers:
        name = provider_name(provider)
        options = dict(provider[1]) if isinstance(provider, tuple) else {}
        if name in CUDA_GRAPH_OPTIONS:
            options[CUDA_GRAPH_OPTIONS[name]] = "1"
            provider = (name, options)
        out.append(provider)
    return out


def check_tensors(entry: GraphEntry, inputs: dict, outputs: dict) -> None:
    """Tensors to bind must be every input and output the graph lists, at its shapes and
    dtypes; a missing one or a wrong one is a one-line error naming it."""
    for kind, listed, given in (("input", entry.inputs, inputs), ("output", entry.outputs, outputs)):
        for spec in listed:
            held = given.get(spec.name)
            if held is None:
                raise EdgecapError(f"{entry.file}: {kind} {spec.name!r} not bound")
            if list(held.shape) != spec.shape or held.dtype != np.dtype(spec.dtype):
                raise EdgecapError(f"{entry.file}: {kind} {spec.name!r} bound to a {held.dtype} tensor of shape "
                                   f"{list(held.shape)}, the graph has {spec.dtype} {spec.shape}")
        extra = sorted(set(given) - {t.name for t in listed})
        if extra:
            raise EdgecapError(f"{entry.file}: {kind} {extra[0]!r} bound, but the graph has no such {kind}")


class OrtTensor:
    """A tensor in the memory an onnxruntime session computes in, allocated once: an `OrtValue`
    on the GPU (written and read with one copy each), or on the CPU provider a numpy array the
    `OrtValue` wraps (written and read where it lies; `read` returns the live array)."""

    def __init__(self, shape, dtype, device: str, device_id: int = 0, in_place: bool | None = None):
        """in_place: wrap a numpy array (the default on the CPU); False allocates an OrtValue
        written and read by copies, as on a GPU (how tests run the GPU's copies on a CPU)."""
        import onnxruntime as ort

        self.shape, self.dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        self._zeros = None
        if device == "cpu" if in_place is None else in_place:
            self.host = np.zeros(self.shape, self.dtype)
            self.value = ort.OrtValue.ortvalue_from_numpy(self.host)
        else:
            self.host = None
            self.value = ort.OrtValue.ortvalue_from_shape_and_type(list(self.shape), self.dtype, device, device_id)

    def write(self, data: np.ndarray) -> None:
        if self.host is not None:
            np.copyto(self.host, data)
        else:
            self.value.update_inplace(np.ascontiguousarray(data, dtype=self.dtype))

    def read(self) -> np.ndarray:
        return self.host if self.host is not None else self.value.numpy()

    def zero(self) -> None:
        if self.host is not None:
            self.host.fill(0)
            return
        if self._zeros is None:  # calloc'ed pages: kept for the next frame's reset
            self._zeros = np.zeros(self.shape, self.dtype)
        self.value.update_inplace(self._zeros)


def open_session(path: Path, providers: list | None, threads: int = 0, spin: bool = True,
                 cuda_graph: bool = False):
    """An onnxruntime session with edgecap's settings, for a bundle's graphs and for a detector
    beside them (runtime/detector.py), so both share one providers / threads / spin choice.

    providers: None picks the best installed (falling back, and saying so once); named ones
    must all start. threads: intra-op threads (0: onnxruntime's default, one per physical
    core). spin: whether idle intra-op threads busy-wait for the next op of a run
    (onnxruntime's default) or sleep, leaving their cores to the robot's other processes;
    either way they sleep once the run returns. cuda_graph: turn on the CUDA or TensorRT
    provider's CUDA-graph capture (one of them must be among the providers, else a one-line
    error)."""
    import onnxruntime as ort

    explicit = providers is not None
    providers = check_providers(list(providers)) if explicit else default_providers()
    if cuda_graph:
        if not any(provider_name(p) in CUDA_GRAPH_OPTIONS for p in providers):
            raise EdgecapError(f"CUDA graphs for {path.name} need the CUDA or TensorRT execution provider; "
                               f"the providers are {', '.join(map(provider_name, providers))}")
        providers = with_cuda_graphs(providers)
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    # Spin between the ops of a run, never after it. A bundle runs its graphs in turn (visual,
    # encoder, then the step twenty times); a session's threads left spinning after its run
    # took the cores from the next graph's: on 2 cores a batch-1 beam-3 decode took 83 ms after
    # the visual and encoder graphs instead of 36 (benchmarks/README.md, "Spinning after a run").
    options.add_session_config_entry("session.force_spinning_stop", "1")
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgecapError(f"onnxruntime cannot load {path}: {first[:200]}") from exc
    dropped = [provider_name(p) for p in providers if provider_name(p) not in session.get_providers()]
    if dropped and explicit:
        raise EdgecapError(f"onnxruntime could not start {', '.join(dropped)} for {path.name} "
                           f"(installed, but no usable device or driver?); it would run on "
                           f"{', '.join(session.get_providers())}, which was not asked for")
    if dropped:
        say_once(f"onnxruntime could not start {', '.join(dropped)}; running on "
                  f"{', '.join(session.get_providers())}")
    return session


class OrtGraph:
    def __init__(self, path: Path, entry: GraphEntry, providers: list | None, threads: int = 0,
                 spin: bool = True, cuda_graph: bool = False):
        """One bundle graph in an `open_session` session (its providers / threads / spin).
        cuda_graph: capture runs bound with `bind_tensors(..., capture=True)` as CUDA graphs
        (the CUDA or TensorRT provider must run the whole graph, else a one-line error)."""
        import onnxruntime as ort

        self.session = open_session(path, providers, threads=threads, spin=spin, cuda_graph=cuda_graph)
        check_graph_io(self.session, entry, path)
        self.entry = entry
        self.output_names = [t.name for t in entry.outputs]
        started = self.session.get_providers()
        # zero-copy IO binding only where every tensor lives in host memory
        self.host_only = started == ["CPUExecutionProvider"]
        self.memory = "cpu" if self.host_only else "cuda" if started[0] in CUDA_GRAPH_OPTIONS else None
        self.device_id = _device_id(providers or [], started[0])  # the defaults name no device: 0
        self.cuda_graph = cuda_graph and self.memory == "cuda"
        if cuda_graph and not self.cuda_graph:
            raise EdgecapError(f"CUDA graphs for {path.name}: onnxruntime runs it on {', '.join(started)}, "
                               f"not on a CUDA device")
        self._graphs_bound = 0
        # runs outside a binding never capture (gpu_graph_id -1): their buffers change per call
        self._plain = ort.RunOptions()
        if self.cuda_graph:
            self._plain.add_run_config_entry("gpu_graph_id", "-1")

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers()

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.output_names, check_feeds(self.entry, feeds), self._plain)

    # -- tensors that stay where the graph runs ------------------------------------------------
    def tensor(self, shape, dtype) -> OrtTensor:
        if self.memory is None:
            raise EdgecapError(f"{self.entry.file}: edgecap holds no tensors for {self.providers[0]}")
        return OrtTensor(shape, dtype, self.memory, self.device_id)

    def bind_tensors(self, inputs: dict[str, OrtTensor], outputs: dict[str, OrtTensor],
                     capture: bool = False) -> Callable[[], None]:
        """Bind every input and output to a tensor once; -> a call that runs the graph on them.
        With CUDA graphs and `capture`, the binding gets its own graph id (1, 2, ...: onnxruntime
        reserves 0), captured on its first runs and replayed after."""
        import onnxruntime as ort

        check_tensors(self.entry, inputs, outputs)
        binding = self.session.io_binding()
        # (`held`, not `tensor`: the offline TensorRT API check reads `tensor` as a TensorRT ITensor)
        for name, held in inputs.items():
            binding.bind_ortvalue_input(name, held.value)
        for name, held in outputs.items():
            binding.bind_ortvalue_output(name, held.value)
        graph_id = None
        options = self._plain
        if self.cuda_graph and capture:
            self._graphs_bound += 1
            graph_id = self._graphs_bound
            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(graph_id))
        return _BoundRun(self.session, binding, options, graph_id)

    def run_into(self, feeds: dict[str, np.ndarray], outputs: dict[str, OrtTensor]) -> None:
        """Run on numpy feeds, writing the outputs named in `outputs` into those tensors (an
        output not named is left in host memory and dropped)."""
        binding = self.session.io_binding()
        for name, value in check_feeds(self.entry, feeds).items():
            binding.bind_cpu_input(name, value)
        for name in self.output_names:
            if name in outputs:
                binding.bind_ortvalue_output(name, outputs[name].value)
            else:
                binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding, self._plain)

    def bind(self, inputs: dict[str, np.ndarray], outputs: list[np.ndarray]) -> Callable[[], None]:
        """Bind host buffers once (zero-copy on the CPU provider); -> a call that runs the graph."""
        bound = check_bound(self.entry, inputs, outputs)
        if not self.host_only:
            def run_and_copy():
                for dst, src in zip(outputs, self.run(bound), strict=True):
                    np.copyto(dst, src)
            return run_and_copy
        binding = self.session.io_binding()
        for name, value in bound.items():
            binding.bind_input(name, "cpu", 0, value.dtype, list(value.shape), value.ctypes.data)
        for name, dst in zip(self.output_names, outputs, strict=True):
            binding.bind_output(name, "cpu", 0, dst.dtype, list(dst.shape), dst.ctypes.data)
        session = self.session
        return lambda: session.run_with_iobinding(binding)


class _BoundRun:
    """One IO binding of a session and the run options it always runs with (`graph_id`: the
    CUDA graph it captures and replays, None for none)."""

    def __init__(self, session, binding, options, graph_id: int | None):
        self.session, self.binding, self.options, self.graph_id = session, binding, options, graph_id

    def __call__(self) -> None:
        self.session.run_with_iobinding(self.binding, self.options)


def _device_id(providers: list, name: str) -> int:
    """The device a provider was asked to run on (its `device_id` option, default 0)."""
    for provider in providers:
        if provider_name(provider) == name and isinstance(provider, tuple):
            return int(provider[1].get("device_id", 0))
    return 0


def check_bound(entry: GraphEntry, inputs: dict[str, np.ndarray], outputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Buffers to bind must already be the graph's tensors exactly (shape, dtype, contiguous):
    a converted copy would not see later writes."""
    bound = check_feeds(entry, inputs)
    for name, value in bound.items():
        if value is not inputs[name]:
            raise EdgecapError(f"{entry.file}: buffer for input {name!r} must be a C-contiguous {value.dtype} array")
    if len(outputs) != len(entry.outputs):
        raise EdgecapError(f"{entry.file}: {len(outputs)} output buffers for {len(entry.outputs)} outputs")
    for spec, dst in zip(entry.outputs, outputs, strict=True):
        if list(dst.shape) != spec.shape or dst.dtype != np.dtype(spec.dtype) or not dst.flags.c_contiguous:
            raise EdgecapError(f"{entry.file}: buffer for output {spec.name!r} must be a C-contiguous "
                               f"{spec.dtype} array of shape {spec.shape}")
    return bound


# -- TensorRT (either distribution: edgecap.runtime.tensorrt_dist) -----------------------------
SUPPORTED_TENSORRT = TENSORRT.majors  # full TensorRT's majors whose API the engine code was checked against


def tensorrt_module(purpose: str, dist: Distribution = TENSORRT):
    """The installed module of `dist`, if it is a release edgecap supports; else a one-line error."""
    return load_distribution(dist, purpose)


def _cudart():
    """cuda-python's runtime module (cuda-bindings >= 12.6; older cuda-python as cuda.cudart)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        cudart = require("cuda.cudart", "trt", "CUDA memory for TensorRT engines")
    return cudart


def _check(result, what: str):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        hint = " (no usable NVIDIA GPU or driver on this machine)" if "Driver" in name or "NoDevice" in name else ""
        raise EdgecapError(f"CUDA error {name} during {what}{hint}")
    return rest[0] if len(rest) == 1 else rest


def local_gpu() -> tuple[str, str]:
    """(GPU name, compute capability 'major.minor') of device 0."""
    cudart = _cudart()
    props = _check(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
    name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
    return name.rstrip("\x00"), f"{props.major}.{props.minor}"


def find_gpu() -> tuple[tuple[str, str] | None, str]:
    """((GPU name, compute capability) of device 0, "") or (None, why there is none)."""
    try:
        cudart = _cudart()
    except EdgecapError as exc:
        return None, str(exc)
    err, count = cudart.cudaGetDeviceCount()
    if int(err) != 0 or count < 1:
        return None, f"CUDA finds no device: {getattr(err, 'name', err)}"
    return local_gpu(), ""


def rebuild_hint(bundle_dir: Path, dist: Distribution | None = None) -> str:
    choice = f" --tensorrt {dist.name}" if dist is not None else ""
    return (f"rebuild the engines here from the ONNX graphs in the bundle: "
            f"edgecap export {shlex.quote(str(bundle_dir))} --engine trt{choice} --force")


def engine_distribution(info) -> Distribution:
    return DISTRIBUTIONS[info.distribution]


def engines_importable(manifest) -> bool:
    """Whether the TensorRT that built the manifest's engines imports here."""
    return any(installed(engine_distribution(g.tensorrt)) for g in manifest.graphs if g.engine == "tensorrt")


def why_engine_cannot_run(entry: GraphEntry, bundle_dir: Path, advice: bool = True) -> str:
    """"" when this machine can run the engine `entry` lists, else one line saying why and what
    to do: another TensorRT, no GPU, or a GPU the engine was not built for. advice: say how to
    run the bundle without a GPU (edgecap run's --engine onnxruntime)."""
    info = entry.tensorrt
    dist = engine_distribution(info)
    built = f"{entry.file} was built with {dist.describe(info.version)}"
    ccs = ", ".join(info.compute_capabilities)
    if not installed(dist):
        return (f"{built}, which is not installed here: pip install \"edgecap[{dist.extra}]\" (that release), "
                f"or " + rebuild_hint(bundle_dir))
    trt = load_distribution(dist, "native TensorRT engines")
    if trt.__version__ != info.version:
        return f"{built}, this machine has {trt.__version__}; " + rebuild_hint(bundle_dir, dist)
    gpu, why = find_gpu()
    if gpu is None:
        run_onnx = "; run the bundle's ONNX graphs with onnxruntime instead (--engine onnxruntime)" if advice else ""
        return (f"{built} for compute capability {ccs}: engines need a supported GPU, and this machine has none "
                f"({why}){run_onnx}")
    name, cc = gpu
    if cc not in info.compute_capabilities:
        other = TENSORRT if dist is TENSORRT_RTX else dist  # a GPU TensorRT for RTX does not take: full TensorRT's
        return (f"{built} for compute capability {ccs}, this machine has {name} ({cc}); "
                + rebuild_hint(bundle_dir, other))
    return ""


def check_engine_compatible(entry: GraphEntry, bundle_dir: Path):
    """Refuse, in one line, an engine this machine cannot run; -> the TensorRT module to run it."""
    problem = why_engine_cannot_run(entry, bundle_dir)
    if problem:
        raise ManifestError(problem)
    return load_distribution(engine_distribution(entry.tensorrt), "native TensorRT engines")


# TensorRT for RTX's EngineInvalidityDiagnostics bits, in words
_INVALID = {"VERSION_MISMATCH": "another TensorRT for RTX version built it",
            "UNSUPPORTED_CC": "it was not built for this GPU's compute capability",
            "OLD_CUDA_DRIVER": "the CUDA driver is too old", "OLD_CUDA_RUNTIME": "the CUDA runtime is too old",
            "INSUFFICIENT_GPU_MEMORY": "the GPU has too little memory", "MALFORMED_ENGINE": "the file is damaged",
            "CUDA_ERROR": "CUDA failed"}


@trt_apis(*RTX_RELEASES)
def check_engine_validity(trt, runtime, plan: bytes, path: Path, bundle_dir: Path) -> None:
    """TensorRT for RTX's own verdict on a serialized engine, before deserialising it."""
    validity, diagnostics = runtime.get_engine_validity(plan)
    if validity == trt.EngineValidity.INVALID:
        reasons = [words for name, words in _INVALID.items()
                   if int(diagnostics) & int(getattr(trt.EngineInvalidityDiagnostics, name))]
        raise ManifestError(f"TensorRT for RTX {trt.__version__} cannot run {path.name} here: "
                            f"{'; '.join(reasons) or 'it gives no reason'}; " + rebuild_hint(bundle_dir))


def runtime_cache_path(bundle_dir: Path, engine_file: str) -> Path:
    """TensorRT for RTX's runtime cache of one engine (the kernels compiled when it first ran),
    in a folder beside the bundle: the bundle holds only the files its manifest lists."""
    bundle_dir = Path(bundle_dir).resolve()
    return bundle_dir.with_name(bundle_dir.name + ".runtime-cache") / f"{engine_file}.cache"


@trt_apis(*RTX_RELEASES)
def open_runtime_cache(engine, path: Path):
    """-> (runtime config with a runtime cache, the cache) for TensorRT for RTX's execution
    context; the cache starts from `path` when that file holds one this machine can use."""
    runtime_config = engine.create_runtime_config()
    runtime_cache = runtime_config.create_runtime_cache()
    if path.is_file() and not runtime_cache.deserialize(path.read_bytes()):
        say_once(f"{path} was written for another GPU, driver or TensorRT for RTX: its kernels are compiled anew")
    runtime_config.set_runtime_cache(runtime_cache)
    return runtime_config, runtime_cache


@trt_apis(*RTX_RELEASES)
def rtx_graph_capture(trt, engine, runtime_cache):
    """A runtime config whose execution contexts TensorRT for RTX runs as CUDA graphs, captured
    on their first run and replayed after (its own capture: a stream capture around its engines
    needs them built with REQUIRE_USER_ALLOCATION); the kernels go into `runtime_cache`."""
    runtime_config = engine.create_runtime_config()
    runtime_config.set_runtime_cache(runtime_cache)
    runtime_config.cuda_graph_strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
    return runtime_config


def check_engine_io(trt, engine, entry: GraphEntry, path: Path) -> None:
    """The engine's I/O tensors must be the ones its manifest entry lists (name, direction,
    dtype, shape): the runner binds one device buffer per listed tensor, sized from the
    manifest, so an engine from another graph would read and write past them."""
    tensors = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        mode = "input" if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else "output"
        dtype = engine.get_tensor_dtype(name)
        tensors[name] = (mode, TRT_DTYPES.get(dtype.name, dtype.name), [int(d) for d in engine.get_tensor_shape(name)])
    check_io_table(tensors, entry, path, "engine")


# TensorRT's DataType member names -> the manifest's dtypes
TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "INT64": "int64", "INT32": "int32", "BOOL": "bool",
               "INT8": "int8", "UINT8": "uint8", "BF16": "bfloat16"}


def check_io_table(tensors: dict, entry: GraphEntry, path: Path, what: str) -> None:
    """`tensors` ({name: (mode, dtype, shape)}: an engine's, or the network it is built from)
    must be the ones `entry` lists, else a one-line error naming the first that differs."""
    for kind, listed in (("input", entry.inputs), ("output", entry.outputs)):
        for spec in listed:
            if spec.name not in tensors:
                raise ManifestError(f"{path}: the {what} has no {kind} {spec.name!r} that manifest.json lists "
                                    f"(its tensors: {', '.join(tensors)}); the file does not belong to this bundle")
            mode, dtype, shape = tensors[spec.name]
            if (mode, dtype, shape) != (kind, spec.dtype, spec.shape):
                raise ManifestError(f"{path}: {spec.name!r} is the {what}'s {mode}, {dtype} {shape}; manifest.json "
                                    f"says {kind} {spec.dtype} {spec.shape}; the file does not belong to this bundle")
    extra = sorted(set(tensors) - {t.name for t in entry.inputs + entry.outputs})
    if extra:
        raise ManifestError(f"{path}: the {what} has {tensors[extra[0]][0]} {extra[0]!r}, which manifest.json does "
                            f"not list; the file does not belong to this bundle")


class CudaTensor:  # pragma: no cover - needs a GPU
    """A tensor in CUDA device memory (cuda-python), allocated once; written and read with one
    synchronous copy each, zeroed with a memset."""

    def __init__(self, cudart, shape, dtype):
        self.cudart = cudart
        self.shape, self.dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        self.nbytes = max(1, int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize)
        self.ptr = int(_check(cudart.cudaMalloc(self.nbytes), "cudaMalloc"))

    def write(self, data: np.ndarray) -> None:
        host = np.ascontiguousarray(data, dtype=self.dtype)
        _check(self.cudart.cudaMemcpy(self.ptr, host.ctypes.data, host.nbytes,
                                      self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), "copy in")

    def read(self) -> np.ndarray:
        host = np.empty(self.shape, self.dtype)
        _check(self.cudart.cudaMemcpy(host.ctypes.data, self.ptr, host.nbytes,
                                      self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost), "copy out")
        return host

    def zero(self) -> None:
        _check(self.cudart.cudaMemset(self.ptr, 0, self.nbytes), "cudaMemset")

    def __del__(self):
        if getattr(self, "ptr", None):
            self.cudart.cudaFree(self.ptr)


class _CapturedRun:  # pragma: no cover - needs a GPU
    """One execution context with its tensors' addresses set once: runs the engine on them,
    or, with `capture`, records the run as a CUDA graph on its second call (the first flushes
    TensorRT's deferred work, as its docs ask) and replays that graph afterwards. TensorRT for
    RTX captures its own graphs (`TrtGraph.new_context`): its engines allocate memory while
    they run unless built with REQUIRE_USER_ALLOCATION, so a stream capture around them fails."""

    def __init__(self, graph: TrtGraph, addresses: dict[str, int], capture: bool):
        self.graph, self.capture, self.exec, self.calls = graph, capture and not graph.rtx, None, 0
        self.context = graph.new_context(captured=capture)
        for name, ptr in addresses.items():
            if not self.context.set_tensor_address(name, ptr):
                raise EdgecapError(f"TensorRT refused the device buffer for {name!r} of {graph.entry.file}")

    def __call__(self) -> None:
        cudart, stream = self.graph.cudart, self.graph.stream
        self.calls += 1
        if self.exec is not None:
            _check(cudart.cudaGraphLaunch(self.exec, stream), "cudaGraphLaunch")
        elif self.capture and self.calls >= 2:
            mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
            _check(cudart.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")
            ok = self.context.execute_async_v3(stream)
            captured = _check(cudart.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
            if not ok:
                raise EdgecapError(f"TensorRT failed to capture {self.graph.entry.file} as a CUDA graph")
            self.exec = _check(cudart.cudaGraphInstantiate(captured, 0), "cudaGraphInstantiate")
            _check(cudart.cudaGraphLaunch(self.exec, stream), "cudaGraphLaunch")
        elif not self.context.execute_async_v3(stream):
            raise EdgecapError(f"TensorRT failed to run {self.graph.entry.file}")
        _check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        if self.graph.runtime_cache is not None:
            self.graph.save_runtime_cache()


class TrtGraph:
    """One deserialised engine with device buffers allocated once (static shapes).

    `run` / `bind` copy host arrays into the engine's own buffers and back on every call (the
    visual and encoder graphs, and a bundle decoded on the host); `tensor` / `bind_tensors` /
    `run_into` keep the decoding state in device memory that several engines share, each
    binding with its own execution context, so no copy of the cache is made per step."""

    memory = "cuda"

    def __init__(self, path: Path, entry: GraphEntry, bundle_dir: Path, cuda_graph: bool = False):
        trt = check_engine_compatible(entry, bundle_dir)
        self.cudart = cudart = _cudart()
        self.entry = entry
        self.cuda_graph = cuda_graph
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        plan = path.read_bytes()
        rtx = engine_distribution(entry.tensorrt) is TENSORRT_RTX
        if rtx:
            check_engine_validity(trt, self.runtime, plan, path, bundle_dir)
        self.engine = self.runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise ManifestError(f"TensorRT cannot deserialise {path}; " + rebuild_hint(bundle_dir))
        check_engine_io(trt, self.engine, entry, path)
        # TensorRT for RTX compiles kernels at the first run: kept beside the bundle for the next start
        self.runtime_cache, self.runtime_cache_file = None, runtime_cache_path(bundle_dir, entry.file)
        self.rtx, self.runtime_config, self.captured_config = rtx, None, None
        if rtx:
            self.runtime_config, self.runtime_cache = open_runtime_cache(self.engine, self.runtime_cache_file)
            if cuda_graph:
                self.captured_config = rtx_graph_capture(trt, self.engine, self.runtime_cache)
        self.context = self.new_context()
        # the stream as an integer handle: execute_async_v3 takes `stream_handle: int`
        self.stream = int(_check(cudart.cudaStreamCreate(), "cudaStreamCreate"))
        self.buffers: dict[str, int] = {}
        for spec in entry.inputs + entry.outputs:
            nbytes = max(1, int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize)
            self.buffers[spec.name] = int(_check(cudart.cudaMalloc(nbytes), "cudaMalloc"))
            if not self.context.set_tensor_address(spec.name, self.buffers[spec.name]):
                raise EdgecapError(f"TensorRT refused the device buffer for {spec.name!r} of {path.name}")

    def new_context(self, captured: bool = False):
        """An execution context of the engine (TensorRT for RTX's share the runtime cache).
        captured: TensorRT for RTX records and replays the context's runs as CUDA graphs itself
        (the graph must be opened with `cuda_graph`); full TensorRT's are captured by the caller."""
        if not self.rtx:
            return self.engine.create_execution_context()
        runtime_config = self.captured_config if captured else self.runtime_config
        return self.engine.create_execution_context(runtime_config)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = [np.empty(t.shape, np.dtype(t.dtype)) for t in self.entry.outputs]
        self._run_into(feeds, outputs)
        return outputs

    def bind(self, inputs: dict[str, np.ndarray], outputs: list[np.ndarray]) -> Callable[[], None]:
        """Host buffers copied to and from the engine's device buffers on every call."""
        bound = check_bound(self.entry, inputs, outputs)
        return lambda: self._run_into(bound, outputs)

    def tensor(self, shape, dtype) -> CudaTensor:  # pragma: no cover - needs a GPU
        return CudaTensor(self.cudart, shape, dtype)

    def bind_tensors(self, inputs: dict[str, CudaTensor], outputs: dict[str, CudaTensor],
                     capture: bool = False) -> Callable[[], None]:  # pragma: no cover - needs a GPU
        check_tensors(self.entry, inputs, outputs)
        addresses = {name: t.ptr for name, t in (*inputs.items(), *outputs.items())}
        return _CapturedRun(self, addresses, capture and self.cuda_graph)

    def run_into(self, feeds: dict[str, np.ndarray], outputs: dict[str, CudaTensor]) -> None:  # pragma: no cover
        """Run on numpy feeds with the outputs named in `outputs` written into those tensors."""
        for name, held in outputs.items():
            self.context.set_tensor_address(name, held.ptr)
        try:
            self._run_into(feeds, [])
        finally:
            for name in outputs:
                self.context.set_tensor_address(name, self.buffers[name])

    def _run_into(self, feeds: dict[str, np.ndarray], outputs: list[np.ndarray]) -> None:
        cudart = self.cudart
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for name, value in check_feeds(self.entry, feeds).items():
            _check(cudart.cudaMemcpyAsync(self.buffers[name], value.ctypes.data, value.nbytes, h2d, self.stream), "copy in")
        if not self.context.execute_async_v3(self.stream):
            raise EdgecapError(f"TensorRT failed to run {self.entry.file}")
        for spec, dst in zip(self.entry.outputs, outputs, strict=False):
            _check(cudart.cudaMemcpyAsync(dst.ctypes.data, self.buffers[spec.name], dst.nbytes, d2h, self.stream), "copy out")
        _check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        if self.runtime_cache is not None:
            self.save_runtime_cache()

    @trt_apis(*RTX_RELEASES)
    def save_runtime_cache(self) -> None:
        """Write the kernels TensorRT for RTX compiled for this engine beside the bundle, once,
        after its first run; a folder that cannot be written is said once, never fatal."""
        runtime_cache, self.runtime_cache = self.runtime_cache, None
        try:
            self.runtime_cache_file.parent.mkdir(exist_ok=True)
            with atomic_path(self.runtime_cache_file) as tmp:
                tmp.write_bytes(bytes(runtime_cache.serialize()))
        except (OSError, EdgecapError) as exc:
            say_once(f"cannot keep TensorRT for RTX's runtime cache ({exc}): the next start compiles its kernels again")

    def __del__(self):  # pragma: no cover - needs a GPU
        cudart = getattr(self, "cudart", None)
        for ptr in getattr(self, "buffers", {}).values():
            cudart.cudaFree(ptr)
        if getattr(self, "stream", None) is not None:
            cudart.cudaStreamDestroy(self.stream)
