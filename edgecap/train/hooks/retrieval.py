"""RA-Transformer's training extra: the retrieval index of a run and the retrieved captions it
feeds the encoder (edgecap.train.retrieval has the reasons).

    [retrieval]     which index to use or build, where the frozen visual front end that embeds
                    the images comes from
    setup           the front end copied from [retrieval].visual_from (else as initialised) and
                    frozen; the index reused or built into <run dir>/index, and recorded in the
                    model config (retrieval.index) that every checkpoint saves and export copies
    inputs          memory_tokens: stored neighbours of a training image, searched ones for any
                    other image (validation, `edgecap caption` of a checkpoint)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgecap.errors import EdgecapError
from edgecap.models.registry import VISUAL
from edgecap.train.config import choice, positive
from edgecap.train.hook import TrainingHook, register
from edgecap.train.process import barrier
from edgecap.train.retrieval import (
    TrainingRetrieval,
    freeze_visual,
    load_visual,
    prepare_index,
)


@dataclass
class RetrievalSection:
    """The index's image embeddings come from the model's own visual front end, which therefore
    stays frozen for the whole run (weights and BatchNorm statistics): the neighbours a model
    trains with are the neighbours its bundle will find on the robot."""

    # an existing `edgecap index build` directory; "" = build <run dir>/index
    index: str = field(default="", metadata={"path": True})
    # checkpoint whose visual front end is copied in (then frozen); "" = the run's seeded init
    visual_from: str = field(default="", metadata={"path": True})
    kind: str = "auto"  # index kind when building: auto | flat | hnsw
    batch_size: int = 64  # images per embedding batch when building


@register("retrieval")
class RetrievalHook(TrainingHook):
    Config = RetrievalSection
    unused = "retrieves nothing"
    inputs = ("memory_tokens",)
    freezes_visual = True

    @classmethod
    def check(cls, config: RetrievalSection, model_cfg, where: str) -> None:
        choice(config.kind, ("auto", "flat", "hnsw"), f"{where}: [retrieval].kind")
        positive(config.batch_size, f"{where}: [retrieval].batch_size")
        if model_cfg.retrieval.index:
            raise EdgecapError(
                f"{where}: [model].retrieval.index is set by the trainer; name an existing index with "
                f"[retrieval].index = \"DIR\" instead"
            )
        if config.visual_from and not VISUAL.get(model_cfg.visual.kind).takes_images:
            raise EdgecapError(
                f"{where}: [retrieval].visual_from needs an image front end, but visual.kind = "
                f"{model_cfg.visual.kind!r} (precomputed features are embedded as they are)"
            )

    @classmethod
    def for_checkpoint(cls, checkpoint) -> RetrievalHook:
        index = checkpoint.config.retrieval.index
        if not index:
            raise EdgecapError("this RA-Transformer checkpoint names no retrieval index (retrieval.index)")
        hook = cls()
        hook.retrieval = TrainingRetrieval(Path(index), checkpoint.vocab, checkpoint.config)
        return hook

    def setup(self, run) -> None:
        r, model = self.config, run.model
        if r.visual_from:
            load_visual(model, r.visual_from)
        freeze_visual(model)
        path = prepare_index(model, r, run.cfg.run.seed, run.splits.train, run.out, run.images, run.features,
                             run.is_main, barrier, run.progress and run.is_main)
        model.cfg.retrieval.index = str(path)  # saved with every checkpoint: export copies it
        self.retrieval = TrainingRetrieval(path, run.vocab, model.cfg)

    def for_item(self, item, rng) -> tuple:
        return self.retrieval(item, rng)

    def for_features(self, feats, mask) -> tuple:
        return self.retrieval.for_features(feats, mask)
