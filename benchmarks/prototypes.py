"""PMA prototype refresh time (K-Means + kNN, Eq. 4) vs bank size and m: FAISS vs plain PyTorch.

    python benchmarks/prototypes.py [--banks 4000,16000,64000] [--counts 128,1024] [--dim 512]
                                    [--iterations 10] [--topk 32] [--repeats 5]
                                    [--out benchmarks/results/prototypes/] [--quick]

One refresh of one layer = K-Means over the key bank [N, d] (m centroids, the same number of
Lloyd iterations and the same kind of start, m random bank points, for both) plus the top-k
nearest bank keys of each centroid and the Eq. 4 weighted values. The FAISS side is
`edgecap.train.kmeans.compute_prototypes`, what training runs. The baseline is written here:
a plain PyTorch K-Means (matmul distances, argmin, index_add_ means) and a cdist + topk kNN.
Banks are clustered random keys (a Gaussian mixture), so K-Means does real work. Times are
medians over repeats after one warm-up, with perf_counter, on all cores for both libraries.
Also reported: each method's K-Means objective (mean squared distance to the nearest
centroid), to show the two do the same job. Writes a table, prototypes.json and prototypes.png.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgecap.argtypes import COUNT, Integer, ListOf, Parser  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "prototypes"


def make_bank(n: int, dim: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((256, dim)).astype(np.float32) * 2.0
    keys = centres[rng.integers(0, 256, n)] + rng.standard_normal((n, dim)).astype(np.float32)
    values = rng.standard_normal((n, dim)).astype(np.float32)
    return keys, values


def torch_kmeans(x, count: int, iterations: int, seed: int):
    """Lloyd's K-Means in plain PyTorch: the baseline a research codebase would write."""
    import torch

    g = torch.Generator().manual_seed(seed)
    centroids = x[torch.randperm(x.shape[0], generator=g)[:count]].clone()
    x_sq = (x * x).sum(1, keepdim=True)
    for _ in range(iterations):
        dist = x_sq - 2.0 * x @ centroids.T + (centroids * centroids).sum(1)
        assign = dist.argmin(1)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=count).unsqueeze(1)
        # An empty cluster keeps its previous centroid.
        centroids = torch.where(counts > 0, sums / counts.clamp(min=1), centroids)
    return centroids


def torch_refresh(keys, values, count: int, topk: int, iterations: int, seed: int):
    import torch

    t0 = time.perf_counter()
    centroids = torch_kmeans(keys, count, iterations, seed)
    t1 = time.perf_counter()
    dist, ids = torch.cdist(centroids, keys).topk(topk, dim=1, largest=False)
    weights = torch.softmax(-dist, dim=1)
    proto_values = (weights.unsqueeze(2) * values[ids]).sum(1)
    t2 = time.perf_counter()
    return centroids.numpy(), proto_values.numpy(), t1 - t0, t2 - t1


def objective(keys, centroids) -> float:
    from edgecap.train.kmeans import nearest

    dist2, _ = nearest(centroids, keys, 1)
    return float(dist2.mean())


def median_ms(xs):
    return 1e3 * statistics.median(xs)


def run_cell(n: int, count: int, args) -> list[dict]:
    import torch

    from edgecap.train.kmeans import compute_prototypes

    keys, values = make_bank(n, args.dim, seed=n)
    tkeys, tvalues = torch.from_numpy(keys), torch.from_numpy(values)
    times = {method: {"total": [], "kmeans": [], "knn": []} for method in ("faiss", "torch")}
    centroids = {}
    # Methods alternate within each repeat, so load from other processes hits both alike.
    for rep in range(args.warmup + args.repeats):
        for method in ("faiss", "torch"):
            t = time.perf_counter()
            if method == "faiss":
                p = compute_prototypes(keys, values, count, args.topk, seed=rep, iterations=args.iterations)
                cents, k_s, n_s = p.keys, p.kmeans_seconds, p.knn_seconds
            else:
                with torch.no_grad():
                    cents, _, k_s, n_s = torch_refresh(tkeys, tvalues, count, args.topk, args.iterations, rep)
            total = time.perf_counter() - t
            centroids[method] = cents
            if rep >= args.warmup:
                for key, val in (("total", total), ("kmeans", k_s), ("knn", n_s)):
                    times[method][key].append(val)
    rows = []
    for method, t in times.items():
        rows.append({
            "method": method, "bank": n, "m": count, "dim": args.dim, "iterations": args.iterations,
            "topk": args.topk, "refresh_ms": median_ms(t["total"]), "kmeans_ms": median_ms(t["kmeans"]),
            "knn_ms": median_ms(t["knn"]), "refresh_min_ms": 1e3 * min(t["total"]),
            "refresh_max_ms": 1e3 * max(t["total"]), "repeats": args.repeats,
            "objective": objective(keys, centroids[method]),
        })
    faiss_row, torch_row = rows
    faiss_row["speedup_vs_torch"] = torch_row["refresh_ms"] / faiss_row["refresh_ms"]
    return rows


def host_info() -> dict:
    import faiss
    import torch

    versions = {}
    for name in ("numpy", "torch", "faiss-cpu", "matplotlib"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "logical_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "faiss_threads": faiss.omp_get_max_threads(), "faiss_gpus": faiss.get_num_gpus(),
            "python": platform.python_version(), "versions": versions,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks._common import save_png

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for colour, count in enumerate(sorted({r["m"] for r in rows})):
        for method, style in (("faiss", "-o"), ("torch", "--s")):
            pts = sorted((r["bank"], r["refresh_ms"]) for r in rows if r["m"] == count and r["method"] == method)
            ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], style, color=f"C{colour}",
                    label=f"{method}, m={count}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bank size N (key vectors per layer)")
    ax.set_ylabel("refresh time per layer (s)")
    d, it = rows[0]["dim"], rows[0]["iterations"]
    ax.set_title(f"PMA prototype refresh: K-Means ({it} it.) + top-k kNN, d={d}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_png(fig, path, dpi=120)


def main(argv=None) -> int:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--banks", type=ListOf(COUNT), default="4000,16000,64000", help="bank sizes N, comma-separated")
    ap.add_argument("--counts", type=ListOf(COUNT), default="128,1024", help="prototype counts m, comma-separated")
    ap.add_argument("--dim", type=COUNT, default=512)
    ap.add_argument("--iterations", type=COUNT, default=10, help="Lloyd iterations, same for both")
    ap.add_argument("--topk", type=COUNT, default=32)
    ap.add_argument("--repeats", type=COUNT, default=5)
    ap.add_argument("--warmup", type=Integer(0), default=1)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (keeps the script working in tests)")
    args = ap.parse_args(argv)
    if args.quick:
        args.banks, args.counts, args.dim, args.iterations, args.repeats, args.warmup = [600, 1200], [16], 32, 3, 1, 0
        args.topk = min(args.topk, 8)
    banks, counts = args.banks, args.counts

    import torch

    from edgecap.io import write_json_atomic
    from edgecap.progress import progress_bar

    torch.set_num_threads(os.cpu_count() or 1)
    rows = []
    cells = [(n, m) for n in banks for m in counts if n > m]
    for n, m in progress_bar(cells, quiet=args.quick, desc="prototype refresh"):
        rows.extend(run_cell(n, m, args))

    header = f"{'method':>6} {'bank':>7} {'m':>5} {'refresh ms':>11} {'kmeans ms':>10} {'knn ms':>8} {'objective':>10} {'speed-up':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        speed = f"{r['speedup_vs_torch']:.2f}x" if "speedup_vs_torch" in r else ""
        print(f"{r['method']:>6} {r['bank']:>7} {r['m']:>5} {r['refresh_ms']:>11.1f} {r['kmeans_ms']:>10.1f} "
              f"{r['knn_ms']:>8.1f} {r['objective']:>10.2f} {speed:>8}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "prototypes.json", {
        "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
        "quick": args.quick, "host": host_info(), "rows": rows,
    })
    plot(rows, out / "prototypes.png")
    print(f"wrote {out / 'prototypes.json'} and {out / 'prototypes.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
