"""onnxruntime's session settings for a bundle, measured: what its graph optimiser fuses, what
session start costs with and without a graph optimised ahead of time, and spinning threads.

    python benchmarks/ort_settings.py [--model m2] [--batch 1] [--beam 5] [--vocab 10201]
        [--threads 2] [--repeats 5] [--out DIR] [--quick] [--fused-attention] [--against REV]
        [--weight-only [--agreement-checkpoint CKPT] [--agreement-samples N]]
        [--only fused-attention|against|weight-only]

One exported bundle (random weights, the latency benchmark's model and inputs), fp32 and int8:
- fusions: node counts of each graph before and after onnxruntime's in-session optimiser
  (ORT_ENABLE_ALL, the default) and the fused operators it made, beside what the offline
  transformer optimiser (`onnxruntime.transformers.optimizer`, model type bert) fuses;
- start: seconds to create every graph's session from the bundle's graph (optimised at start)
  and from a copy optimised ahead of time (ORT_ENABLE_EXTENDED, saved; ALL-level layouts are
  hardware-specific), medians over repeats;
- spinning: ms of a whole caption batch (encode + beam decode) and the process CPU ms it costs,
  with idle intra-op threads busy-waiting (onnxruntime's default) or sleeping;
- attention (`--fused-attention`): ms of one decoder step, the exported graph against the same
  graph with its attention blocks rewritten as onnxruntime's fused CPU kernels
  (`benchmarks/_fused_attention.py`: an experiment, not part of export), timed interleaved in one process, every buffer bound once as the
  runtime binds it, at a mid-caption step (half the cache filled). Variants: `mha`
  (MultiHeadAttention everywhere, layouts unchanged: the transposed keys are transposed back
  in the graph), `mha-bnsh` (the same with the cache and cross keys in the kernel's layout) and
  `gqa-bnsh` (self-attention as GroupQueryAttention writing the new slot into the cache in
  place, cross-attention as MultiHeadAttention);
- against a revision (`--against REV`): ms of one decoder step of this checkout's exported
  graph against the graph that the source at git revision REV exports from the same
  checkpoint (a subprocess importing REV's `edgecap`), timed in turns the same way, with each
  graph's node counts before and after onnxruntime's optimiser. The step graph's inputs and
  outputs must be the same at both revisions (the bundle contract), so the same buffers drive
  both;
- weight-only (`--weight-only`): ms of one decoder step, fp32 and dynamic int8 against the
  bundle `--quantize weight-only` exports (the step's linear layers as onnxruntime's
  `MatMulNBits`, the encoder dynamic int8) with each of several schemes (8 and 4 bits, block
  sizes, accuracy levels; `benchmarks/_weight_only.py`), timed in turns the same way, each
  against its own step bound; the encoder graph in each form; whole captions of the bundles
  computing in int8, timed in turns; each variant's bundle size, the 1-minute load around
  the timing, and each variant's caption agreement with PyTorch fp32
  on a trained checkpoint (`--agreement-checkpoint`, default the packaged demo model; greedy
  and the bundle's beam over `--agreement-samples` fresh scenes of its world).
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, host_info, summary, timed, write_json  # noqa: E402
from latency import MAX_LEN, VOCAB, BundleRunner, build_model, export_bundle, inputs  # noqa: E402

from edgecap.argtypes import BATCH, BEAM, COUNT, THREADS, Integer, Parser  # noqa: E402


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="m2")
    p.add_argument("--batch", type=BATCH, default=1)
    p.add_argument("--beam", type=BEAM, default=5)
    p.add_argument("--vocab", type=VOCAB, default=10201)
    p.add_argument("--max-len", type=MAX_LEN, default=20)
    p.add_argument("--threads", type=THREADS, default=2)
    p.add_argument("--repeats", type=COUNT, default=5)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ort_settings"))
    p.add_argument("--quick", action="store_true", help="tiny model, two repeats: keeps the script working in tests")
    p.add_argument("--fused-attention", action="store_true",
                   help="also time one decoder step, the exported graph against its fused-attention rewrites")
    p.add_argument("--against", metavar="REV", default=None,
                   help="also time one decoder step, this checkout's exported graph against the one git revision "
                        "REV exports from the same weights")
    p.add_argument("--weight-only", action="store_true",
                   help="also time one decoder step: fp32, dynamic int8 and weight-only MatMulNBits variants, "
                        "with their bundle sizes and caption agreement on a trained checkpoint")
    p.add_argument("--agreement-checkpoint", default=str(REPO / "edgecap" / "assets" / "demo-smart.pt"),
                   help="the trained checkpoint whose captions the weight-only variants are compared on")
    p.add_argument("--agreement-samples", type=Integer(0), default=50, help="0: time only")
    p.add_argument("--only", choices=("fused-attention", "against", "weight-only"), default=None,
                   help="measure only this section (skips fusions, start and spinning)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 2)
        args.agreement_samples = min(args.agreement_samples, 4)
    args.stop_at_eos = False
    if args.only == "fused-attention":
        args.fused_attention = True
    if args.only == "weight-only":
        args.weight_only = True
    if args.only == "against" and not args.against:
        p.error("--only against needs --against REV")
    return args


def ops(path: Path) -> collections.Counter:
    import onnx

    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def session(path: Path, level, threads: int, save_to: Path | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = threads
    options.log_severity_level = 3  # saving an ALL-level graph warns that it is hardware-specific: we know
    if save_to is not None:
        options.optimized_model_filepath = str(save_to)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def fusions(graph: Path, scratch: Path, threads: int) -> dict:
    import logging

    import onnxruntime as ort
    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)  # "producer not matched" for int8

    in_session = scratch / f"{graph.stem}.all.onnx"
    session(graph, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads, in_session)
    before, after = ops(graph), ops(in_session)
    try:
        offline = optimize_model(str(graph), model_type="bert", num_heads=0, hidden_size=0, opt_level=0, use_gpu=False)
        made_offline = {k: v for k, v in offline.get_fused_operator_statistics().items() if v}
    except Exception as exc:  # its pattern matchers assume shapes of graphs they were written for
        made_offline = {f"failed: {type(exc).__name__}": 0}
    return {"nodes": sum(before.values()), "nodes_in_session": sum(after.values()),
            "made_in_session": {k: v for k, v in after.items() if k not in before},
            "transformers_optimizer": made_offline}


def start_seconds(graphs: list[Path], scratch: Path, threads: int, repeats: int) -> dict:
    import onnxruntime as ort

    ahead = []
    for g in graphs:
        ahead.append(scratch / f"{g.stem}.ext.onnx")
        session(g, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, threads, ahead[-1])
    level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    at_start = timed(lambda: [session(g, level, threads) for g in graphs], repeats)
    saved = timed(lambda: [session(g, level, threads) for g in ahead], repeats)
    return {"optimised_at_start_ms": summary(at_start)["median_ms"], "optimised_ahead_ms": summary(saved)["median_ms"]}


def spinning(model, args, bundle_dir: Path) -> dict:
    from edgecap.contract.beam import DecodeOptions
    from edgecap.runtime.session import Bundle

    feats, mask, extra = inputs(model, args.batch)
    options = DecodeOptions(beam_size=args.beam, max_len=model.cfg.max_len, stop_at_eos=False)
    result = {}
    for spin in (True, False):
        runner = BundleRunner(Bundle.load(bundle_dir, threads=args.threads, spin=spin), feats, mask, extra, options)
        caption = lambda r=runner: (r.encode(), r.decode())  # noqa: E731
        caption()
        wall, cpu = [], []
        for _ in range(args.repeats):
            c0, t0 = time.process_time(), time.perf_counter()
            caption()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        result["spin" if spin else "no_spin"] = {"ms": summary(wall)["median_ms"], "cpu_ms": summary(cpu)["median_ms"]}
    return result


ATTENTION_VARIANTS = {"mha": {}, "mha-bnsh": {"bnsh": True}, "gqa-bnsh": {"self_kernel": "gqa", "bnsh": True}}


class _BoundStep:
    """One graph (a decoder step, or the encoder) in a session with every input and output bound to a numpy buffer
    once, as `edgecap.runtime` binds it; a graph whose self-attention writes the cache in place
    (`<cache>.present` outputs) gets those outputs bound onto the cache inputs."""

    def __init__(self, path: Path, threads: int, step: int):
        import numpy as np
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # as the runtime (engines.OrtGraph): threads stop spinning when a run returns, so the
        # graph timed next in turn does not share the cores with this one's spinning threads
        options.add_session_config_entry("session.force_spinning_stop", "1")
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.binding = self.session.io_binding()
        rng = np.random.default_rng(0)
        self.buffers = {}
        for i in self.session.get_inputs():
            if i.name == "step":
                value = np.array(step, np.int64)
            elif i.type == "tensor(int64)":
                value = rng.integers(0, 100, i.shape).astype(np.int64)
            elif i.type == "tensor(bool)":
                value = np.ones(i.shape, bool)
            else:
                value = rng.standard_normal(i.shape).astype(np.float32)
            self.buffers[i.name] = value
            self.binding.bind_cpu_input(i.name, value)
        for o in self.session.get_outputs():
            present = o.name.removesuffix(".present")
            dtype = {"tensor(int64)": np.int64, "tensor(bool)": bool}.get(o.type, np.float32)
            value = self.buffers[present] if present != o.name else np.empty(o.shape, dtype)
            self.buffers[o.name] = value
            self.binding.bind_output(o.name, "cpu", 0, value.dtype, list(value.shape), value.ctypes.data)

    def __call__(self):
        self.session.run_with_iobinding(self.binding)


def steps_in_turns(graphs: dict[str, Path], threads: int, repeats: int, steps_per_repeat: int = 20) -> dict:
    """Median ms per decoder step of each graph, at a mid-caption step (half the cache filled),
    timed in turns (one block of steps each, `repeats` rounds) so a disturbance hits them all
    alike; the first graph is the reference of `vs_first`."""
    import onnx

    step = onnx.load(str(next(iter(graphs.values()))), load_external_data=False)
    half = next((d.dim_value for i in step.graph.input if i.name.startswith("self_v")
                 for d in i.type.tensor_type.shape.dim[-2:-1]), 2) // 2
    runs = {name: _BoundStep(path, threads, half) for name, path in graphs.items()}
    times = {name: [] for name in runs}
    for run in runs.values():
        timed(run, 0, 10)
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(sum(timed(run, steps_per_repeat, 0)) / steps_per_repeat)
    medians = {name: summary(t)["median_ms"] for name, t in times.items()}
    first = next(iter(medians.values()))
    return {name: {"step_ms": ms, "vs_first": ms / first} for name, ms in medians.items()}


def attention_steps(step_graph: Path, scratch: Path, threads: int, repeats: int) -> dict:
    """ms per decoder step of the exported graph and of each fused-attention rewrite."""
    import onnx
    from _fused_attention import fuse_attention

    graphs, blocks = {"plain": step_graph}, {}
    for name, options in ATTENTION_VARIANTS.items():
        model, counts = fuse_attention(onnx.load(str(step_graph)), **options)
        graphs[name] = scratch / f"{step_graph.stem}.{name}.onnx"
        onnx.save(model, str(graphs[name]))
        blocks[name] = dict(counts)
    out = {}
    for name, timing in steps_in_turns(graphs, threads, repeats).items():
        out[name] = {"step_ms": timing["step_ms"], "vs_plain": timing["vs_first"],
                     "nodes": len(onnx.load(str(graphs[name])).graph.node), "fused_blocks": blocks.get(name, {})}
    return out


def export_at_revision(rev: str, checkpoint: Path, settings: dict, out: Path, scratch: Path) -> Path:
    """Export `checkpoint` with the `edgecap` source of git revision `rev` (its tree unpacked
    under `scratch`, imported by a subprocess ahead of this checkout's) -> the bundle directory."""
    import json
    import subprocess

    source = scratch / f"edgecap-{rev}"
    if not source.exists():
        source.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "edgecap"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "import edgecap\n"
        f"assert Path(edgecap.__file__).resolve().is_relative_to(Path({str(source)!r}).resolve()), edgecap.__file__\n"
        "from edgecap.export.bundle import export_bundle\n"
        "from edgecap.export.formats import resolve_settings\n"
        "export_bundle(Path(sys.argv[1]), resolve_settings(json.loads(sys.argv[2])), progress=False)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run([sys.executable, "-P", "-c", code, str(checkpoint), json.dumps({**settings, "out": str(out)})],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"exporting at {rev} failed: {done.stderr.strip().splitlines()[-1:]}")
    return out


def layout_counts(graph: Path, scratch: Path, threads: int) -> dict:
    """Nodes, Reshapes and Transposes of a graph as exported and after onnxruntime's optimiser."""
    import onnxruntime as ort

    optimised = scratch / f"{graph.parent.name}.{graph.stem}.all.onnx"
    session(graph, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads, optimised)
    out = {}
    for key, path in (("exported", graph), ("in_session", optimised)):
        c = ops(path)
        out[key] = {"nodes": sum(c.values()), "Reshape": c["Reshape"], "Transpose": c["Transpose"]}
    return out


def against_revision(rev: str, model_name: str, bundle_dir: Path, workdir: Path, scratch: Path, args,
                     precision: str) -> dict:
    """This checkout's decoder step against the one REV exports from the same checkpoint."""
    settings = {"engine": "onnx", "batch": args.batch, "beam": args.beam, "precision": precision, "samples": 1}
    theirs = export_at_revision(rev, workdir / f"{model_name}.pt", settings, workdir / f"{bundle_dir.name}-at-{rev}",
                                workdir / "sources")
    graphs = {rev: theirs / "decoder_step.onnx", "this checkout": bundle_dir / "decoder_step.onnx"}
    timing = steps_in_turns(graphs, args.threads, max(args.repeats, 3))
    return {name: {**timing[name], **layout_counts(path, scratch, args.threads)} for name, path in graphs.items()}


def captions_in_turns(model, bundles: dict[str, Path], args) -> dict:
    """Median ms of a whole caption batch (encode + beam decode, forced to full length) per bundle,
    through edgecap.runtime as `latency.py` runs it, timed in turns."""
    from edgecap.contract.beam import DecodeOptions
    from edgecap.runtime.session import Bundle

    feats, mask, extra = inputs(model, args.batch)
    options = DecodeOptions(beam_size=args.beam, max_len=model.cfg.max_len, stop_at_eos=False)
    runners = {name: BundleRunner(Bundle.load(root, threads=args.threads), feats, mask, extra, options)
               for name, root in bundles.items()}
    captions = {name: (lambda r=r: (r.encode(), r.decode())) for name, r in runners.items()}
    for caption in captions.values():
        timed(caption, 0, 1)
    times = {name: [] for name in captions}
    for _ in range(args.repeats):
        for name, caption in captions.items():
            times[name] += timed(caption, 1, 0)
    return {name: summary(t)["median_ms"] for name, t in times.items()}


def weight_only_steps(model, roots: dict[str, Path], scratch: Path, args) -> dict:
    """ms per decoder step of the fp32 and dynamic int8 bundles and of the bundle
    `--quantize weight-only` exports with each weight-only scheme (its step as MatMulNBits,
    the encoder dynamic int8), timed in turns; each with its bundle MB and the ratio to its own
    step bound (latency.py's: fp32, int8 or 4-bit weights, fp32 FLOPs; the machine's limits
    measured just before the timing). Then the encoder graph in each form, and whole captions
    of every bundle with int8 compute. A scheme that onnxruntime cannot quantize or load here
    is reported with the reason."""
    import onnxruntime as ort
    from _roofline import matmul_throughput, memory_bandwidth, step_bound_seconds, step_cost
    from _weight_only import QUICK_SCHEMES, SCHEMES, bundle_mb, encoder_graphs, requantized

    from edgecap.errors import EdgecapError
    from edgecap.export.quantize import WEIGHT_ONLY

    bundles = {"fp32": roots["fp32"], "dynamic int8": roots["int8"]}
    weight_bits = {"fp32": 32, "dynamic int8": 8}
    failed = {}
    schemes = QUICK_SCHEMES if args.quick else SCHEMES
    for scheme in schemes:
        print(f"{args.model}: weight-only {scheme.name} ...", flush=True)
        try:
            root = requantized(roots, scratch / scheme.name, scheme)
            session(root / "decoder_step.onnx", ort.GraphOptimizationLevel.ORT_ENABLE_ALL, args.threads)
        except (EdgecapError, RuntimeError) as exc:  # onnxruntime raises its own RuntimeError subclasses
            failed[scheme.name] = str(exc).splitlines()[0][:200]
            continue
        bundles[scheme.name], weight_bits[scheme.name] = root, scheme.bits
    cost = step_cost(model, args.batch, args.beam)
    load_before = os.getloadavg()[0]
    limits = {"bandwidth": memory_bandwidth(64 if args.quick else 256, threads=args.threads),
              "flops": matmul_throughput(256 if args.quick else 1024, threads=args.threads)}
    timing = steps_in_turns({name: root / "decoder_step.onnx" for name, root in bundles.items()}, args.threads,
                            max(args.repeats, 3))
    encoders = steps_in_turns(encoder_graphs(roots, scratch, WEIGHT_ONLY), args.threads, max(args.repeats, 3), 5)
    int8_compute = {name: root for name, root in bundles.items()
                    if name in ("fp32", "dynamic int8") or name.endswith("-a4")}
    print(f"{args.model}: whole captions ...", flush=True)
    captions = captions_in_turns(model, int8_compute, args)
    load_after = os.getloadavg()[0]
    dynamic = timing["dynamic int8"]["step_ms"]
    steps = {}
    for name, t in timing.items():
        bound_ms = 1e3 * step_bound_seconds(cost, limits["bandwidth"], limits["flops"], weight_bits[name] / 32)
        steps[name] = {**t, "vs_dynamic_int8": t["step_ms"] / dynamic, "bundle_mb": bundle_mb(bundles[name]),
                       "bound_ms": bound_ms, "vs_bound": t["step_ms"] / bound_ms, "caption_ms": captions.get(name)}
    return {"rows": args.batch * args.beam, "steps": steps, "failed": failed, "limits": limits,
            "encoder_ms": {name: e["step_ms"] for name, e in encoders.items()}, "load_1m": [load_before, load_after]}


def main(argv=None) -> int:
    import torch

    from edgecap.io import write_text_atomic

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(args.model, args)
    report = {"host": host_info(), "args": vars(args), "bundles": {}}
    with tempfile.TemporaryDirectory(prefix="edgecap-ort-") as tmp:
        workdir = Path(tmp)
        roots = {}
        for precision in ("fp32", "int8"):
            print(f"{args.model} {precision}: exporting ...", flush=True)
            bundle, reason = export_bundle(model, args.model, args.batch, args.beam, precision, "onnx", workdir, args.threads)
            if bundle is None:
                raise SystemExit(f"export failed: {reason}")
            root = roots[precision] = bundle.path
            graphs = [root / g.file for g in bundle.manifest.graphs if g.file.endswith(".onnx")]
            scratch = workdir / f"scratch-{precision}"
            scratch.mkdir()
            sections = {}
            if not args.only:
                sections = {
                    "fusions": {g.stem: fusions(g, scratch, args.threads) for g in graphs},
                    "start": start_seconds(graphs, scratch, args.threads, args.repeats),
                    "spinning": spinning(model, args, root),
                }
            if args.fused_attention:
                print(f"{args.model} {precision}: timing fused attention ...", flush=True)
                sections["attention"] = attention_steps(root / "decoder_step.onnx", scratch, args.threads,
                                                        max(args.repeats, 3))
            if args.against:
                print(f"{args.model} {precision}: timing the decoder step against {args.against} ...", flush=True)
                sections["against"] = against_revision(args.against, args.model, root, workdir, scratch, args,
                                                       precision)
            report["bundles"][precision] = sections
        if args.weight_only:
            report["weight_only"] = weight_only_steps(model, roots, workdir, args)
        if args.weight_only and args.agreement_samples:
            print(f"weight-only: caption agreement on {args.agreement_checkpoint} ...", flush=True)
            from _weight_only import QUICK_SCHEMES, SCHEMES, agreement

            report["weight_only"]["agreement"] = agreement(
                Path(args.agreement_checkpoint), QUICK_SCHEMES if args.quick else SCHEMES, args.agreement_samples,
                3, workdir / "agreement")
    write_json(out / "ort_settings.json", report)
    write_text_atomic(out / "ort_settings.md", markdown(report))
    print(markdown(report))
    print(f"wrote {out / 'ort_settings.json'}, {out / 'ort_settings.md'}")
    return 0


def markdown(report: dict) -> str:
    lines = []
    if all("fusions" in b for b in report["bundles"].values()):
        lines += settings_markdown(report)
    attention = {p: b["attention"] for p, b in report["bundles"].items() if "attention" in b}
    if attention:
        a = report["args"]
        lines += ["" if lines else f"{a['model']}, batch {a['batch']}, beam {a['beam']}: ms per decoder step "
                  "(x the exported graph's), fused blocks", "",
                  "| precision | plain | " + " | ".join(ATTENTION_VARIANTS) + " |",
                  "|---" * (len(ATTENTION_VARIANTS) + 2) + "|"]
        for precision, variants in attention.items():
            cells = [f"{variants['plain']['step_ms']:.2f} ({variants['plain']['nodes']} nodes)"]
            cells += [f"{variants[v]['step_ms']:.2f} ({variants[v]['vs_plain']:.2f}x, {variants[v]['nodes']} nodes)"
                      for v in ATTENTION_VARIANTS]
            lines.append(f"| {precision} | " + " | ".join(cells) + " |")
    against = {p: b["against"] for p, b in report["bundles"].items() if "against" in b}
    if against:
        a = report["args"]
        lines += [""] * bool(lines) + [f"{a['model']}, batch {a['batch']}, beam {a['beam']}: ms per decoder step, "
                  f"this checkout against {a['against']} (same weights); nodes / Reshapes as exported -> after "
                  "onnxruntime's optimiser", "", "| precision | graph | ms / step | x the first | nodes | Reshape |",
                  "|---|---|---|---|---|---|"]
        for precision, graphs in against.items():
            for name, g in graphs.items():
                lines.append(f"| {precision} | {name} | {g['step_ms']:.3f} | {g['vs_first']:.3f}x | "
                             f"{g['exported']['nodes']} -> {g['in_session']['nodes']} | "
                             f"{g['exported']['Reshape']} -> {g['in_session']['Reshape']} |")
    if "weight_only" in report:
        lines += [""] * bool(lines) + weight_only_markdown(report)
    return "\n".join(lines) + "\n"


def weight_only_markdown(report: dict) -> list[str]:
    a, w = report["args"], report["weight_only"]
    agree = w.get("agreement", {})
    lines = [f"{a['model']}, batch {a['batch']}, beam {a['beam']} ({w['rows']} decoder rows), {a['threads']} threads: "
             f"ms per decoder step timed in turns (1-minute load {w['load_1m'][0]:.1f} before, "
             f"{w['load_1m'][1]:.1f} after; limits {w['limits']['bandwidth'] / 1e9:.1f} GB/s, "
             f"{w['limits']['flops'] / 1e9:.0f} GFLOP/s); x bound: against the step's own bound (its weights' bytes); "
             f"ms / caption: the batch's encode + beam decode of {a['max_len']} tokens through edgecap.runtime; "
             f"caption agreement with PyTorch fp32 on {Path(a['agreement_checkpoint']).name} (greedy / beam 3 "
             "identical, CIDEr-D delta) and its bundle MB",
             "", "| variant | ms / step | x fp32 | x dynamic int8 | x bound | ms / caption | bundle MB | greedy | "
             "beam 3 | CIDEr-D delta | agreement bundle MB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in w["steps"].items():
        g = agree.get(name)
        cells = (f"{g['greedy_identical']:.0%} | {g['beam_identical']:.0%} | {g['cider_delta']:+.3f} | "
                 f"{g['bundle_mb']:.2f}") if g and "failed" not in g else "– | – | – | –"
        caption = f"{s['caption_ms']:.1f}" if s["caption_ms"] else "–"
        lines.append(f"| {name} | {s['step_ms']:.3f} | {s['vs_first']:.2f}x | {s['vs_dynamic_int8']:.2f}x | "
                     f"{s['vs_bound']:.2f}x | {caption} | {s['bundle_mb']:.1f} | {cells} |")
    lines += [f"| {name} | failed: {why} | | | | | | | | | |" for name, why in w["failed"].items()]
    lines += ["", "the bundles' encoder graph, ms (timed in turns): " + ", ".join(
        f"{name} {ms:.2f}" for name, ms in w["encoder_ms"].items())]
    return lines


def settings_markdown(report: dict) -> list[str]:
    lines = ["| precision | graph | nodes | after onnxruntime | fused in session | transformers optimizer |",
             "|---|---|---|---|---|---|"]
    for precision, b in report["bundles"].items():
        for graph, f in b["fusions"].items():
            made = ", ".join(f"{k} {v}" for k, v in f["made_in_session"].items()) or "–"
            offline = ", ".join(f"{k} {v}" for k, v in f["transformers_optimizer"].items()) or "–"
            lines.append(f"| {precision} | {graph} | {f['nodes']} | {f['nodes_in_session']} | {made} | {offline} |")
    lines += ["", "| precision | session start, optimised at start | optimised ahead | caption ms, spinning | CPU ms | "
              "caption ms, sleeping | CPU ms |", "|---|---|---|---|---|---|---|"]
    for precision, b in report["bundles"].items():
        s, p = b["start"], b["spinning"]
        lines.append(f"| {precision} | {s['optimised_at_start_ms']:.0f} ms | {s['optimised_ahead_ms']:.0f} ms | "
                     f"{p['spin']['ms']:.1f} | {p['spin']['cpu_ms']:.1f} | {p['no_spin']['ms']:.1f} | "
                     f"{p['no_spin']['cpu_ms']:.1f} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
