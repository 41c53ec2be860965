"""onnxruntime's session settings for a bundle, measured: what its graph optimiser fuses, what
session start costs with and without a graph optimised ahead of time, and spinning threads.

    python benchmarks/ort_settings.py [--model m2] [--batch 1] [--beam 5] [--vocab 10201]
        [--threads 2] [--repeats 5] [--out DIR] [--quick]

One exported bundle (random weights, the latency benchmark's model and inputs), fp32 and int8:
- fusions: node counts of each graph before and after onnxruntime's in-session optimiser
  (ORT_ENABLE_ALL, the default) and the fused operators it made, beside what the offline
  transformer optimiser (`onnxruntime.transformers.optimizer`, model type bert) fuses;
- start: seconds to create every graph's session from the bundle's graph (optimised at start)
  and from a copy optimised ahead of time (ORT_ENABLE_EXTENDED, saved; ALL-level layouts are
  hardware-specific), medians over repeats;
- spinning: ms of a whole caption batch (encode + beam decode) and the process CPU ms it costs,
  with idle intra-op threads busy-waiting (onnxruntime's default) or sleeping.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, host_info, summary, timed, write_json  # noqa: E402
from latency import BundleRunner, build_model, export_bundle, inputs  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="m2")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--vocab", type=int, default=10201)
    p.add_argument("--max-len", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ort_settings"))
    p.add_argument("--quick", action="store_true", help="tiny model, two repeats: keeps the script working in tests")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 2)
    args.stop_at_eos = False
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
    offline = optimize_model(str(graph), model_type="bert", num_heads=0, hidden_size=0, opt_level=0, use_gpu=False)
    return {"nodes": sum(before.values()), "nodes_in_session": sum(after.values()),
            "made_in_session": {k: v for k, v in after.items() if k not in before},
            "transformers_optimizer": {k: v for k, v in offline.get_fused_operator_statistics().items() if v}}


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
        for precision in ("fp32", "int8"):
            print(f"{args.model} {precision}: exporting ...", flush=True)
            bundle, reason = export_bundle(model, args.model, args.batch, args.beam, precision, "onnx", workdir, args.threads)
            if bundle is None:
                raise SystemExit(f"export failed: {reason}")
            root = bundle.path
            graphs = [root / g.file for g in bundle.manifest.graphs if g.file.endswith(".onnx")]
            scratch = workdir / f"scratch-{precision}"
            scratch.mkdir()
            report["bundles"][precision] = {
                "fusions": {g.stem: fusions(g, scratch, args.threads) for g in graphs},
                "start": start_seconds(graphs, scratch, args.threads, args.repeats),
                "spinning": spinning(model, args, root),
            }
    write_json(out / "ort_settings.json", report)
    write_text_atomic(out / "ort_settings.md", markdown(report))
    print(markdown(report))
    print(f"wrote {out / 'ort_settings.json'}, {out / 'ort_settings.md'}")
    return 0


def markdown(report: dict) -> str:
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
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
