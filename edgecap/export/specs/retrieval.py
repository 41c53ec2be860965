"""RA-Transformer: the Transformer-core graphs plus the retrieval assets the runtime needs.

    encoder  features, mask, memory_tokens [B, k, length] int64 -> cross tensors, including
             side_k, side_v [dec_layers, B, H, k*length, d_head] and side_mask [B, k*length]

The retrieved captions are an input of the encoder graph (computed once per image, like the
visual cross K/V), so the decoder step stays the plain static step. The model's index
(`retrieval.index` in its config, an `edgecap index build` directory) goes into the bundle as
`retrieval/index.faiss` plus `retrieval/memory_tokens.npy` (captions already encoded with the
model's vocabulary), so the robot runs retrieval with faiss-cpu and no tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from edgecap.errors import EdgecapError
from edgecap.export.specs.base import EXPORT_SPECS
from edgecap.export.specs.transformer import TransformerSpec
from edgecap.retrieval.bundle import write_assets
from edgecap.retrieval.command import visual_fingerprint
from edgecap.retrieval.index import CaptionIndex
from edgecap.retrieval.memory import caption_token_table


@EXPORT_SPECS.register("retrieval")
class RetrievalSpec(TransformerSpec):
    def assets(self, root: Path, vocab) -> dict | None:
        cfg = self.cfg
        if not cfg.retrieval.index:
            return None  # a bundle whose caller supplies memory_tokens itself
        path = Path(cfg.retrieval.index)
        index = CaptionIndex.load(path)
        made = index.meta.get("embedding", {})
        if made.get("visual_sha256"):
            if visual_fingerprint(self.model) != made["visual_sha256"]:
                raise EdgecapError(
                    f"retrieval index {path} was built with a different visual front end than this "
                    f"checkpoint's (visual_sha256 differs); rebuild it with edgecap index build --checkpoint"
                )
        if self.takes_images is False and made.get("source") == "checkpoint":
            raise EdgecapError(f"retrieval index {path} embeds images, but this model reads features")
        table = caption_token_table(index.captions, vocab.stoi, cfg.retrieval.length,
                                    cfg.bos_id, cfg.eos_id, cfg.pad_id, cfg.unk_id)
        return write_assets(index, table, root, cfg.retrieval.k, cfg.retrieval.length, cfg.pad_id)
