"""Representative inputs for every graph, recorded while the fp32 bundle captions sample inputs.

Static int8 quantization and the TensorRT INT8 calibrator need the tensors each graph really
sees: images (or features), the encoder's inputs, and the decoder step's token / step / cache /
cross at every step of beam search. Running the fp32 ONNX bundle itself gives exactly those,
with no PyTorch in the loop.
"""

from __future__ import annotations

import numpy as np

from edgecap.contract.beam import DecodeOptions
from edgecap.runtime.session import Bundle


class _Recorder:
    def __init__(self, graph, store: list, limit: int):
        self.graph, self.entry, self.store, self.limit = graph, graph.entry, store, limit

    def _keep(self, feeds):
        if len(self.store) < self.limit:
            names = {t.name for t in self.entry.inputs}
            self.store.append({k: np.array(v, copy=True) for k, v in feeds.items() if k in names})

    def run(self, feeds):
        self._keep(feeds)
        return self.graph.run(feeds)

    def bind(self, inputs, outputs):
        run = self.graph.bind(inputs, outputs)

        def record_and_run():
            self._keep(inputs)  # the bound buffers hold this call's inputs now
            run()
        return record_and_run


def record_feeds(bundle: Bundle, batches: list[np.ndarray | tuple], limit: int = 64) -> dict[str, list[dict]]:
    """role -> list of feed dicts, from captioning `batches` (model inputs, numpy, static batch)."""
    store: dict[str, list[dict]] = {role: [] for role in bundle._graphs}
    original = dict(bundle._graphs)
    try:
        for role, graph in original.items():
            bundle._graphs[role] = _Recorder(graph, store[role], limit)
        options = DecodeOptions(beam_size=bundle.beam_size, max_len=bundle.max_len)
        n_extra = len(bundle.encode_extra_names)
        for inputs in batches:
            front, extra = (inputs[:-n_extra], inputs[-n_extra:]) if n_extra else (inputs, ())
            feats, mask = bundle.visual(front[0]) if bundle.has_visual else front
            bundle.decode(bundle.encode(feats, mask, *extra), options)
    finally:
        bundle._graphs.update(original)
    return store
