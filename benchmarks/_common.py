"""Shared benchmark plumbing: timing with warm-up, percentiles, host facts, output files.

Benchmarks report medians over repeats after warm-up and save the machine they ran on;
absolute times vary between machines, ratios measured in one run hold.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def timed(fn, repeats: int, warmup: int = 1) -> list[float]:
    """Seconds per call of `fn()` over `repeats` calls after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


class Breakdown:
    """Seconds spent in each named part of decoding and the steps run, since `reset`: wrap a
    part's calls with `wrap(part, fn)`; calls of the first part count the steps."""

    def __init__(self, parts: tuple[str, ...]):
        self.parts = parts
        self.reset()

    def reset(self):
        self.seconds = dict.fromkeys(self.parts, 0.0)
        self.steps = 0

    def wrap(self, part: str, fn):
        def timed_call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start
                self.steps += part == self.parts[0]
        return timed_call


def percentile(values, q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    pos = (len(values) - 1) * q / 100.0
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def summary(seconds: list[float]) -> dict:
    return {
        "median_ms": 1e3 * statistics.median(seconds),
        "p10_ms": 1e3 * percentile(seconds, 10),
        "p90_ms": 1e3 * percentile(seconds, 90),
        "repeats": len(seconds),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_info(packages=("numpy", "torch", "onnxruntime", "onnx", "faiss-cpu", "spacy", "opencv-python-headless")) -> dict:
    versions = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def check_folder_arg(parser, path: str | Path, flag: str = "--out") -> None:
    """A folder option (--out, --workdir) that names a file, or a place nothing can be written,
    is the parser's one-line error (exit 2) before any work, not a traceback at the end."""
    from edgecap.errors import EdgecapError
    from edgecap.io import probe_writable

    path = Path(path)
    if path.exists() and not path.is_dir():
        parser.error(f"{flag} {path} exists and is not a directory; name a folder for the results")
    try:
        probe_writable(path, flag)
    except EdgecapError as exc:
        parser.error(str(exc))


def one_line_errors(main):
    """A benchmark's `main(argv) -> int` that reports an edgecap error (a checkpoint that is
    not one, a bundle that does not load, a full disk) as the CLI does: one line
    "NAME: error: ...", exit 1."""
    import functools

    @functools.wraps(main)
    def wrapped(argv=None) -> int:
        from edgecap.errors import EdgecapError

        try:
            return main(argv)
        except EdgecapError as exc:
            print(f"{Path(sys.modules[main.__module__].__file__).name}: error: {exc}", file=sys.stderr)
            return 1
    return wrapped


def write_json(path: Path, obj) -> None:
    from edgecap.io import write_json_atomic

    write_json_atomic(path, obj)


def write_csv(path: Path, rows: list[dict]) -> None:
    import csv
    import io

    from edgecap.io import write_text_atomic

    if not rows:
        write_text_atomic(path, "")
        return
    fields = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, buf.getvalue())


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """columns: (key, header, format spec)."""
    widths = []
    cells = []
    for key, header, spec in columns:
        col = [header] + [("-" if r.get(key) is None else format(r[key], spec)) for r in rows]
        widths.append(max(len(c) for c in col))
        cells.append(col)
    for i in range(len(rows) + 1):
        print("  ".join(cells[j][i].rjust(widths[j]) for j in range(len(columns))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def save_png(fig, path: Path, dpi: int = 110) -> Path:
    """Write a matplotlib figure as PNG atomically (a reader never sees half a plot), marked as
    edgecap's like every PNG it writes (docs/outputs.md), then free it. A results directory is
    the benchmark's own, so what is there under the plot's name is replaced."""
    import matplotlib.pyplot as plt

    from edgecap.png import save_figure

    fig.tight_layout()
    save_figure(fig, path, dpi=dpi, checked=True)
    plt.close(fig)
    return path
