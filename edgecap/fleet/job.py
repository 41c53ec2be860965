"""A fleet job on Ray: the cluster, the actors' resources, the Ray Data pipeline, the driver loop.

    plan rows (one per log not yet finished)
      -> map_batches(read_logs)      CPU tasks, READ_CPUS each: a log's frames decoded into rows
      -> map_batches(CaptionActor)   a fixed pool of actors, each opening the bundle once
      -> iter_batches in the driver  rows gathered per log; a finished log's outputs written

Ray schedules everything (tasks, actors, backpressure through its object store); nothing here
decides where or when work runs. The driver only writes: a caption log per topic and a dataset
part per log under --out (outputs.py), so --out is on the machine running `edgecap fleet`,
while the bundle and the logs must be readable at the same paths on every node (docs/fleet.md).

Actor resources come from the bundle's providers: a bundle with TensorRT engines, or run with
--providers naming CUDA or TensorRT, gets one GPU per actor (one actor per GPU by default); a
CPU bundle gets `--actor-cpus` (default half a CPU per onnxruntime thread) and the CPU provider
only. Fractional CPUs are the point: on 2 CPUs a pool of 2 actors holding 1 CPU each leaves no
CPU for the read tasks that feed them, and the job waits for ever (issue 37 found it); so a pool
whose CPUs leave less than a read task's share free is refused in one line instead.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from edgecap import __version__
from edgecap.errors import EdgecapError, require
from edgecap.io import (
    WorkDir,
    interrupt_delivered,
    sha256_file,
    stop_signal_handlers_kept,
    write_json_atomic,
)

from .plan import JobSettings, Layout, discover, open_out
from .report import FleetReport, Progress, summary_lines

READ_CPUS = 0.25                 # a read task's logical CPUs: reading is mostly I/O and copying
GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")
ACTOR_CALL_ROWS = 16             # rows per actor call (a multiple of the bundle's batch)


@dataclass
class FleetOptions:
    bundle: str
    logs: list[str]
    out: str
    topics: tuple[str, ...] = ()
    all_topics: bool = False
    address: str | None = None           # "auto" or host:port joins a cluster; None starts one here
    actors: int | None = None
    actor_cpus: float | None = None
    threads: int = 1                     # onnxruntime intra-op threads per actor
    providers: list[str] | None = None
    beam: int | None = None
    detections: str | None = None
    categories: str | None = None
    area: str = "box"
    coverage: bool = True
    num_cpus: int | None = None          # the local cluster's CPUs (default: this machine's)
    object_store_mb: int | None = None   # the local cluster's object store
    quiet: bool = False


@dataclass(frozen=True)
class ActorResources:
    device: str                          # "gpu" or "cpu"
    num_cpus: float
    num_gpus: float
    providers: list[str] | None


def actor_resources(manifest, options: FleetOptions) -> ActorResources:
    """What each caption actor asks Ray for, from the bundle's engines and the providers."""
    engines = any(g.engine == "tensorrt" for g in manifest.graphs)
    named_gpu = any(p in GPU_PROVIDERS for p in options.providers or [])
    if engines or named_gpu:
        return ActorResources("gpu", options.actor_cpus or 1.0, 1.0, options.providers)
    cpus = options.actor_cpus if options.actor_cpus is not None else max(options.threads, 1) / 2
    return ActorResources("cpu", cpus, 0.0, options.providers or ["CPUExecutionProvider"])


def pool_size(resources: ActorResources, cluster: dict, wanted: int | None, threads: int) -> int:
    """How many actors: --actors, else one per GPU, or one per `threads` CPUs; refused in one
    line when the cluster cannot hold them beside a read task."""
    cpus, gpus = float(cluster.get("CPU", 0)), float(cluster.get("GPU", 0))
    if resources.device == "gpu":
        if gpus < 1:
            raise EdgecapError("the bundle runs on a GPU (TensorRT engines or a CUDA / TensorRT provider), and the "
                               "Ray cluster has no GPUs; join one that has (--address) or use a CPU bundle")
        count = wanted or int(gpus)
        if count > gpus:
            raise EdgecapError(f"--actors {count}: the cluster has {gpus:g} GPUs, one per actor")
    else:
        count = wanted or max(1, int(cpus // max(threads, 1)))
    need = count * resources.num_cpus + READ_CPUS
    if need > cpus:
        raise EdgecapError(f"{count} actors x {resources.num_cpus:g} CPUs + {READ_CPUS:g} for a read task = "
                           f"{need:g} CPUs, and the cluster has {cpus:g}: the read tasks would starve; give "
                           "fewer --actors or a smaller --actor-cpus")
    return count


def bundle_facts(path: str, beam: int | None):
    """(manifest, sha256 of manifest.json) of a bundle every actor will open; one line when it
    is not a bundle, fails its hashes, reads features, or cannot run `beam`."""
    from edgecap.contract.manifest import MANIFEST_NAME, load_manifest

    manifest = load_manifest(path)
    if manifest.graph("visual") is None:
        raise EdgecapError(f"bundle {path} reads precomputed features (no visual graph); captioning a fleet's "
                           "images needs a bundle exported from an image model")
    if beam is not None and not 1 <= beam <= manifest.beam_size:
        raise EdgecapError(f"--beam {beam} out of range: this bundle's decoder graph was exported for beams "
                           f"1..{manifest.beam_size}")
    return manifest, sha256_file(Path(path) / MANIFEST_NAME)


def _ray():
    """Ray with Ray Data, or the one-line message naming the extra."""
    ray = require("ray", "fleet", "captioning a fleet's logs on a Ray cluster")
    require("ray.data", "fleet", "captioning a fleet's logs on a Ray cluster")
    return ray


@contextlib.contextmanager
def ray_cluster(options: FleetOptions):
    """Ray, connected: to the cluster at --address, else to a new local one, shut down at the end.
    A caller that connected already (a test, a notebook) keeps its connection."""
    ray = _ray()
    if ray.is_initialized():
        yield ray
        return
    quiet = {"include_dashboard": False, "logging_level": logging.WARNING}
    with stop_signal_handlers_kept():  # ray.init makes SIGTERM a bare sys.exit; edgecap's handling stays
        if options.address:
            try:
                ray.init(address=options.address, **quiet)
            except Exception as exc:  # ConnectionError, ValueError, RuntimeError: Ray's own words, one line
                text = str(exc).strip().splitlines()
                raise EdgecapError(f"--address {options.address}: cannot join a Ray cluster "
                                   f"({text[0] if text else exc}); start one with `ray start --head` "
                                   "(docs/fleet.md)") from None
        else:
            store = None if options.object_store_mb is None else options.object_store_mb * 1024 * 1024
            ray.init(num_cpus=options.num_cpus, object_store_memory=store, **quiet)
    try:
        yield ray
    finally:
        ray.shutdown()


def _quiet_ray_data(ray) -> None:
    """Our progress instead of Ray Data's bars and per-dataset log lines."""
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    context.enable_auto_log_stats = False
    context.raise_original_map_exception = True
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    # its one warning that the bars we switched off are off
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)


def run_fleet(options: FleetOptions, out=None) -> dict:
    """Caption the logs of `options` into --out; -> the summary (also OUT/summary.json)."""
    out = out or sys.stdout
    if options.address and (options.num_cpus is not None or options.object_store_mb is not None):
        raise EdgecapError("--num-cpus and --object-store-mb size the local cluster; with --address the cluster "
                           "has its own (set them in `ray start`)")
    _ray()  # before anything is written
    manifest, sha256 = bundle_facts(options.bundle, options.beam)
    layout = Layout(Path(options.out).expanduser().resolve())
    logs = discover(options.logs, layout.root)
    settings = JobSettings(sha256, options.beam or manifest.beam_size, tuple(options.topics), options.all_topics,
                           None if options.detections is None else str(Path(options.detections).resolve()),
                           None if options.categories is None else str(Path(options.categories).resolve()),
                           options.area, options.coverage, __version__)
    open_out(layout, settings)
    # one job per --out at a time: a second one is refused, naming the first (edgecap.io's claim)
    claim = WorkDir(layout.job_file, "--out", exclusive=True)
    try:
        return _run_claimed(options, manifest, sha256, layout, logs, settings, out)
    finally:
        claim.close()


def _run_claimed(options, manifest, sha256, layout, logs, settings, out) -> dict:
    from .outputs import finished, remove_orphans_under

    remove_orphans_under(layout.root)
    pending = {unit: log for unit, log in enumerate(logs) if not finished(layout, log, settings)}
    report = FleetReport(total=len(logs), pending=len(pending))
    resources = actor_resources(manifest, options)
    extra = {"edgecap": __version__, "bundle": str(Path(options.bundle).resolve()), "bundle_sha256": sha256,
             "out": str(layout.root)}
    if pending:
        print(f"edgecap fleet: {len(logs)} logs, {len(logs) - len(pending)} finished before; captioning "
              f"{len(pending)} into {layout.root}", file=out, flush=True)
        progress = Progress(report, options.quiet)
        try:
            with ray_cluster(options) as ray:
                count = pool_size(resources, ray.cluster_resources(), options.actors, options.threads)
                extra.update({"actors_asked": count, "actor_resources": {
                    "device": resources.device, "num_cpus": resources.num_cpus, "num_gpus": resources.num_gpus,
                    "threads": options.threads, "providers": resources.providers}, "read_task_cpus": READ_CPUS,
                    "cluster": {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}})
                _caption(ray, pending, options, settings, resources, count, layout, report, progress,
                         manifest.batch_size)
        except KeyboardInterrupt:  # handled on purpose: the summary below says so, then the command ends
            interrupt_delivered()
            report.stopped_by = "signal"
            raise
        finally:
            progress.close()
            summary = report.to_json(extra)
            write_json_atomic(layout.summary, summary)
            print("\n".join(summary_lines(summary)), file=out, flush=True)
    else:
        summary = report.to_json(extra)
        write_json_atomic(layout.summary, summary)
        print(f"edgecap fleet: all {len(logs)} logs already finished in {layout.root}; nothing to do", file=out)
    return summary


def _caption(ray, pending, options, settings, resources, count, layout, report, progress, bundle_batch) -> None:
    from .actor import CaptionActor
    from .outputs import Gatherer, write_log
    from .reading import ReadOptions, read_logs

    _quiet_ray_data(ray)
    plan = [{"unit": unit, "path": log.path, "kind": log.kind, "key": log.key} for unit, log in pending.items()]
    read = ReadOptions(tuple(options.topics), options.all_topics, options.area, settings.detections,
                       settings.categories)
    rows = -(-ACTOR_CALL_ROWS // bundle_batch) * bundle_batch
    dataset = (ray.data.from_items(plan, override_num_blocks=len(plan))
               .map_batches(read_logs, fn_kwargs={"options": read}, batch_size=1, batch_format="pyarrow",
                            num_cpus=READ_CPUS)
               .map_batches(CaptionActor, fn_constructor_kwargs={
                   "bundle": str(Path(options.bundle).resolve()), "providers": resources.providers,
                   "threads": options.threads, "beam": options.beam, "coverage": options.coverage},
                   batch_size=rows, batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=count),
                   num_cpus=resources.num_cpus, num_gpus=resources.num_gpus or None))
    gatherer = Gatherer(pending)
    bundle = str(Path(options.bundle).resolve())
    for table in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
        report.add_rows(table)
        for state in gatherer.add(table):
            if state.error is not None:
                report.log_failed(state.log.key, state.end)
                progress.update(state.log.key, f"failed: {state.error}")
                continue
            captions = write_log(layout, state, settings, bundle)
            report.log_done(state.log.key, captions, state.end)
            skipped = sum(s["skipped"] for s in state.end["streams"])
            progress.update(state.log.key, f"{captions} captions" + (f", {skipped} frames skipped" if skipped else ""))
    if gatherer.open:  # every plan row ends in an END row; a log missing one is a bug to see
        missing = ", ".join(sorted(s.log.key for s in gatherer.open.values()))
        raise EdgecapError(f"the pipeline ended without finishing {missing}; rerun to caption them")
