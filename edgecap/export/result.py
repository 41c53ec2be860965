"""What an export returns: the bundle's path and the manifest it wrote (torch-free, shared by
the checkpoint export and the rebuild of a bundle's engines)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgecap.contract.manifest import Manifest, ParityNotRun, ParityReport


@dataclass
class ExportResult:
    path: Path
    manifest: Manifest
    defaulted: bool = False  # the path was chosen by edgecap (no --out)

    @property
    def parity(self) -> dict[str, ParityReport | ParityNotRun]:
        return self.manifest.parity
