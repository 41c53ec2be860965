"""The bundle manifest as the runtime reads it: the schema lives in `edgecap.contract.manifest`
(export constructs it, the runtime reads it); these names stay importable from here."""

from edgecap.contract.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    GraphEntry,
    Manifest,
    ManifestError,
    load_manifest,
    read_manifest,
    verify_files,
)
from edgecap.io import sha256_file

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST_NAME", "GraphEntry", "Manifest", "ManifestError",
           "load_manifest", "read_manifest", "sha256_file", "verify_files"]
