"""Export specs: what to export for each kind of model (graphs, I/O names, shapes, tolerances).

`spec_for(model, batch, beam)` picks the spec the model names (`model.export_spec`: its
decoder's, or the one its attention variant asks for) from the EXPORT_SPECS registry, where
each spec module registers its class.
"""

from __future__ import annotations

from edgecap.export.specs.base import EXPORT_SPECS, ExportSpec, GraphSpec
from edgecap.export.specs.retrieval import RetrievalSpec


def spec_for(model, batch: int, beam: int) -> ExportSpec:
    return EXPORT_SPECS.get(model.export_spec)(model, batch, beam)


__all__ = ["EXPORT_SPECS", "ExportSpec", "GraphSpec", "RetrievalSpec", "spec_for"]
