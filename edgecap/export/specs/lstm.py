"""The Up-Down LSTM captioner.

    cache   hidden, cell     [2, R, hidden]   (attention LSTM, language LSTM)
    cross   feats [B, N, d], att_feats [B, N, a], mean_feat [B, d], enc_mask [B, N] bool

The LSTM's state is its own position, so the step graph never reads `step`: the exporter drops
that input and the manifest lists the inputs the graph really has.
"""

from __future__ import annotations

from edgecap.export.specs.base import EXPORT_SPECS, STEP, ExportSpec


@EXPORT_SPECS.register("lstm")
class LSTMSpec(ExportSpec):
    encoder_atol = 1e-5
    step_atol = 1e-4
    step_unused_inputs = (STEP,)
