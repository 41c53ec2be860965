"""`edgecap models`: the bundled presets with their sizes (parameter counts of the paper defaults)."""

from __future__ import annotations

import json

import torch

from edgecap.models import build, list_models


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the table as JSON")


def describe(name: str) -> dict:
    model = build(name)
    parts = model.describe()  # the family says what it is: layers and what it adds
    return {"model": name, "family": model.cfg.family, "layers": parts["layers"], "d": model.cfg.d_model,
            "memory": parts["memory"], "parameters": model.num_parameters()}


def run(args) -> int:
    torch.manual_seed(0)
    rows = [describe(name) for name in list_models()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = f"{'model':<14}{'family':<13}{'layers':<8}{'d':>6}  {'memory':<24}{'parameters':>12}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['model']:<14}{r['family']:<13}{r['layers']:<8}{r['d']:>6}  {r['memory']:<24}{r['parameters'] / 1e6:>11.1f}M")
    print("\nParameter counts at paper defaults with a 10,000-word vocabulary.")
    return 0
