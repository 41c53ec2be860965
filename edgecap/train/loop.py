"""The training loop: XE then SCST, validation CIDEr-D every epoch, exact resume, DDP.

Run directory (`--out`):

    config.toml         verbatim copy of the config the run started with
    vocab.json          the training vocabulary
    metrics.jsonl       one JSON object per line: kind = train | val | prototypes | phase
    curves.png          training loss / SCST reward and validation CIDEr-D
    last.pt             model at the latest save (edgecap checkpoint, fp32)
    last.state.pt       what resuming needs: the weights (so one rename commits a save), optimizer,
                        RNG states of python / numpy / torch (per rank), counters, PMA banks
    best.pt             best validation CIDEr-D so far (any phase)
    best_xe.pt          best validation CIDEr-D of the XE phase (where SCST starts, as in M2)
    test_captions.json  --test: best.pt's captions of the test split (COCO results format)
    epochs/, averaged.pt  [run].average_last = N: the last N epoch ends' weights per phase, and
                        their mean at the end of the run (edgecap.train.averaging)
    data/               the synthetic world, when the config generates it
    index/              RA-Transformer: the retrieval index built with the frozen visual front end

Exact resume: the data order is a function of (seed, epoch), augmentation and RA-T's
retrieved-caption picks of (seed, epoch, index), the learning rate of the step, and everything else random (dropout) comes from the
restored RNG states, so `--resume` after a stop at step s reproduces steps s+1.. of an
uninterrupted run bit for bit (tests/test_train_resume.py checks the losses). The DataLoader
gets its own generator so creating an iterator never draws from the global torch RNG.

Distributed: under `torchrun` (WORLD_SIZE > 1) the process group starts with NCCL on GPUs and
gloo on CPU, the train module is wrapped in DistributedDataParallel, every rank reads its own
shard of each epoch, and only rank 0 writes files (validation runs on rank 0 while the others
wait at a barrier).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from edgecap.contract.beam import DecodeOptions
from edgecap.contract.vocab import Vocab
from edgecap.data.datasets import (
    CaptionDataset,
    EpochBatchSampler,
    FeatureSource,
    ImageSource,
    collate,
)
from edgecap.data.karpathy import KarpathySplits, load_karpathy
from edgecap.errors import EdgecapError
from edgecap.io import (
    remove_orphans,
    write_json_atomic,
    write_text_atomic,
)
from edgecap.jsonio import read_json
from edgecap.models.checkpoint import (
    check_weights,
    load_checkpoint,
    read_payload,
    save_checkpoint,
    save_payload,
)
from edgecap.models.factory import build_from_config
from edgecap.models.pretrained import sha256_file, weights_file
from edgecap.progress import bar_wanted, progress_bar
from edgecap.train.averaging import average_weights, epoch_files, keep_epoch
from edgecap.train.config import TrainConfig, to_toml
from edgecap.train.hook import HookRun, run_hooks
from edgecap.train.metrics_log import MetricsLog, plot_curves
from edgecap.train.overrides import load_config
from edgecap.train.process import (
    barrier,
    init_distributed,
    rank_world,
    rng_state,
    seed_everything,
    set_rng_state,
)
from edgecap.train.run_dir import (
    RUN_FILES,
    STATE_VERSION,
    check_run_dir,
    last_is_behind,
    stored_config,
)
from edgecap.train.schedules import Constant, make_optimizer, set_lr, xe_schedule
from edgecap.train.scst import SCST, reward_scorer
from edgecap.train.split_captions import caption_images, ciderd, results
from edgecap.train.startup import announce
from edgecap.train.xe import CaptionTrainModule, xe_step

PHASES = ("xe", "scst")
RANK_AVERAGED = ("loss", "reward", "baseline")  # under DDP, logged as the mean over every rank


# -- run state -----------------------------------------------------------------------------

@dataclass
class RunState:
    phase: str = "xe"
    epoch: int = 0  # epochs finished in this phase
    batch: int = 0  # batches finished in the current epoch
    step: int = 0  # optimizer steps over the whole run
    phase_step: int = 0  # optimizer steps in this phase (drives the schedule)
    best: float = -1.0  # best validation CIDEr-D, any phase
    best_xe: float = -1.0
    best_xe_epoch: int = 0  # the XE epoch best_xe.pt holds (where SCST starts)
    phase_best: float = -1.0  # best validation CIDEr-D of this phase: what patience counts from
    phase_best_epoch: int = 0
    since_best: int = 0  # epochs of this phase since phase_best last improved
    done: bool = False
    log_acc: dict = field(default_factory=dict)  # running sums for the next metrics line
    seconds: float = 0.0  # wall-clock time spent in this run, over all its resumes


# -- data ----------------------------------------------------------------------------------

def prepare_data(cfg: TrainConfig, out: Path, progress: bool) -> tuple[Path, Path | None, Path | None]:
    """-> (karpathy json, image root or None, features file or None); generates the synthetic
    world on rank 0 when the config asks for it and it is not there yet."""
    d = cfg.data
    if d.synth is None:
        return Path(d.karpathy), Path(d.images) if d.images else None, Path(d.features) if d.features else None
    s = d.synth
    root = Path(s.dir) if s.dir else out / "data"
    wanted = {"seed": s.seed, "images": s.images, "size": s.size, "image_format": s.image_format}
    rank, _ = rank_world()
    if rank == 0 and not (root / "dataset_coco.json").is_file():
        from edgecap.data.synth import generate_dataset

        generate_dataset(root, s.images, seed=s.seed, size=s.size, sequences=0, video_frames=0,
                         image_format=s.image_format, progress=progress)
    barrier()
    meta = root / "synth.json"
    if meta.is_file():
        have = read_json(meta, "the synthetic world's description")
        if not isinstance(have, dict):
            raise EdgecapError(f"{meta}: expected a JSON object (delete {root} to generate the world again)")
        for key, value in wanted.items():
            if have.get(key) != value:
                raise EdgecapError(
                    f"synthetic data in {root} was generated with {key}={have.get(key)!r} but "
                    f"[data.synth].{key} = {value!r}; delete {root} or set [data.synth].dir elsewhere"
                )
    return root / "dataset_coco.json", root / "images", None


# -- the trainer ---------------------------------------------------------------------------

class Trainer:
    def __init__(self, cfg: TrainConfig, out: str | os.PathLike | None = None, resume: bool = False,
                 max_steps: int | None = None, device: str | None = None, progress: bool = True,
                 test: bool = False):
        self.cfg = cfg  # with its paths resolved in setup(); `written` is the config as the user wrote it
        self.written = cfg
        self.started_in = os.getcwd()  # a resumed run: the directory the run started in (setup)
        self.out = Path(out or cfg.run.out or Path("runs") / Path(cfg.source or "run").stem)
        self.resume, self.max_steps, self.progress = resume, max_steps, progress
        self.test = test  # score the test split with best.pt once the run is done
        self.restarted = False  # set when --out holds a same-config run that never saved (setup)
        self._lengths_changed = None  # --resume with other phase lengths: the first one changed
        want = device or cfg.run.device
        if want == "auto":
            want = "cuda" if torch.cuda.is_available() else "cpu"
        if want == "cuda" and not torch.cuda.is_available():
            raise EdgecapError("--device cuda: no CUDA device is available")
        self.started_dist = init_distributed(want)
        self.rank, self.world = rank_world()
        if want == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            want = f"cuda:{local}"
        self.device = torch.device(want)
        self.is_main = self.rank == 0
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)

    # -- setup -----------------------------------------------------------------------------

    def setup(self) -> None:
        found = check_run_dir(self.out, self.resume, self.written)
        self._saved, self.restarted, self._lengths_changed = found.saved, found.restarted, found.lengths_changed
        self.started_in = found.started_in or self.started_in
        if self.is_main:
            for name in RUN_FILES:  # the work folders of writes a kill interrupted
                remove_orphans(self.out / name)
        cfg = self.cfg = self.written.with_paths_from(self.started_in)
        karpathy, images, features = prepare_data(cfg, self.out, self.progress and self.is_main)
        self.data_files = (images, features)
        self._read_splits(karpathy, images)
        self._build_model()
        takes_images = bool(getattr(self.model.visual, "takes_images", False))
        source = self._source(images, features, takes_images)
        if self.is_main:  # every check passed: only now does the run directory get the run's files
            self.out.mkdir(parents=True, exist_ok=True)
            if not self.resume:
                write_text_atomic(self.out / "config.toml", cfg.text or to_toml(cfg.to_dict()))
            if not (self.resume and (self.out / "vocab.json").is_file()):
                write_json_atomic(self.out / "vocab.json", self.vocab.to_dict())
        barrier()
        run = HookRun(self.model, cfg, self.out, self.vocab, self.splits, images if takes_images else None,
                      None if takes_images else features, self.is_main, self.progress)
        for hook in self.hooks:  # e.g. RA-T's index, PMA's banks: after the checks, before the data loaders
            hook.setup(run)
        d = cfg.data
        self.train_set = CaptionDataset(self.splits.train, source, self.vocab, self.model_cfg.max_len, cfg.run.seed,
                                        augment=d.augment != "none",
                                        extra=self.hooks.for_item if self.hooks.inputs else None)
        self.val_images = self.splits.val[: d.val_images] if d.val_images else self.splits.val
        self.eval_source = source
        if takes_images and d.augment != "none":
            self.eval_source = ImageSource(images, self.model_cfg.visual, "none", 0, d.cache_images)
        self.train_refs = [im.caption_strings() for im in self.splits.train]
        self.module = CaptionTrainModule(self.model, frozen_visual=self.hooks.freezes_visual)
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.module = DistributedDataParallel(self.module, device_ids=ids)
        self.metrics = MetricsLog(self.out / "metrics.jsonl", self.is_main)
        if self.restarted:  # an earlier run of this config died before saving: start its log afresh
            self.metrics.truncate_after(-1)
        self.state = RunState(phase=self.cfg.phases()[0])
        self.optimizer = None
        self._pending_optimizer_state = None
        if self.resume:
            self._load_last()
        else:
            seed_everything(cfg.run.seed + self.rank)  # dropout masks differ between ranks

    def _read_splits(self, karpathy: Path, images: Path | None) -> None:
        """The splits and the vocabulary (the run's, the --init-from checkpoint's, or built)."""
        cfg = self.cfg
        self.karpathy = karpathy
        self.splits: KarpathySplits = load_karpathy(karpathy, images, splits=("train", "val", "test") if self.test
                                                    else ("train", "val"))
        if self.test and not self.splits.test:
            raise EdgecapError(f"--test: {karpathy} has no test split")
        if not self.splits.train:
            raise EdgecapError(f"{karpathy}: no training images (split train or restval)")
        if not self.splits.val:
            raise EdgecapError(f"{karpathy}: no validation images (split val)")
        vocab_path = self.out / "vocab.json"
        if self.resume and vocab_path.is_file():
            self.vocab = Vocab.from_dict(read_json(vocab_path, "the run's vocabulary"), where=str(vocab_path))
        elif cfg.run.init_from:  # the words the weights were trained with
            self._init = read_payload(cfg.run.init_from)
            self.vocab = Vocab.from_dict(self._init["vocab"], where=f"--init-from {cfg.run.init_from}")
        else:
            self.vocab = Vocab.build((c for im in self.splits.train for c in im.captions), cfg.data.min_count)

    def _build_model(self) -> None:
        """The model (seeded alike on every rank, --init-from's weights) and its training hooks."""
        cfg, v = self.cfg, self.vocab
        self.model_cfg = cfg.model_config(len(v), {"pad": v.pad_id, "bos": v.bos_id, "eos": v.eos_id, "unk": v.unk_id})
        vc = self.model_cfg.visual
        if vc.weights and not vc.weights_sha256:  # the checkpoint names the exact weights it froze

            self.model_cfg = self.model_cfg.replace(**{"visual.weights_sha256": sha256_file(weights_file(vc.weights))})
        self.features_provenance = cfg.features_provenance()
        seed_everything(cfg.run.seed)  # identical initial weights on every rank
        self.model = build_from_config(self.model_cfg).to(self.device)
        if cfg.run.init_from and not self.resume:
            self._init_weights(cfg.run.init_from)
        for p in self.model.parameters():
            if p.numel() == 0:
                # e.g. M = 0 memory slots: nothing to learn, and DDP would wait for its gradient.
                p.requires_grad_(False)
        self.hooks = run_hooks(self.model_cfg, cfg, self.model)

    def _source(self, images: Path | None, features: Path | None, takes_images: bool):
        """Where the model's inputs come from: the images, or the features file (checked)."""
        kind, d = self.model_cfg.visual.kind, self.cfg.data
        if takes_images and images is None:
            raise EdgecapError(f"model visual front end {kind!r} reads images; set [data].images, not features")
        if not takes_images and features is None:
            raise EdgecapError(f"model visual front end {kind!r} reads precomputed features; set [data].features "
                               f"(HDF5) or use visual.kind = \"cnn\" with images")
        if takes_images:
            return ImageSource(images, self.model_cfg.visual, d.augment, d.shift_pixels, d.cache_images)
        source = FeatureSource(features, self.model_cfg.n_regions, self.model_cfg.d_in)
        source.check(self.splits.train + self.splits.val + self.splits.test)
        return source

    def _init_weights(self, path: str) -> None:
        """--init-from: a new run (e.g. SCST only) starts from a trained checkpoint's weights."""
        payload, self._init = self._init, None
        weights = {k: v.float() if v.is_floating_point() else v for k, v in payload["state_dict"].items()}
        check_weights(self.model.state_dict(), weights, f"--init-from {path}",
                      f"its model is not the one [model] of this config builds (preset {self.cfg.preset!r})")
        self.model.load_state_dict(weights)

    def _out_of_patience(self, phase: str) -> bool:
        patience = self.cfg.patience(phase)
        return patience > 0 and self.state.since_best >= patience

    def _end_of_phase(self, phase: str) -> None:
        """The line that says why a phase ended, once (a resume that replays nothing adds none)."""
        s = self.state
        reason = "patience" if self._out_of_patience(phase) else "epochs"
        line = {"kind": "phase_end", "phase": phase, "step": s.step, "epochs": s.epoch, "reason": reason,
                "best_epoch": s.phase_best_epoch, "best_cider_d": s.phase_best}
        if not self._logged(line):
            self.metrics.write(line)
        if self.is_main and self.progress and reason == "patience":
            print(f"{phase}: validation CIDEr-D has not improved for {s.since_best} epoch{'s' * (s.since_best != 1)} (patience "
                  f"{self.cfg.patience(phase)}); best epoch {s.phase_best_epoch} ({s.phase_best:.3f})",
                  file=sys.stderr, flush=True)

    def _logged(self, line: dict) -> bool:
        """Whether metrics.jsonl already holds `line`: written at the step of the last save,
        before a kill or a stop, it survives the resume's truncation and is not written twice."""
        return self.is_main and line in self.metrics.records()

    # -- checkpoints ---------------------------------------------------------------------

    def _meta(self, val: float | None = None) -> dict:
        s = self.state
        # the config's relative paths are relative to where the run started (edgecap.config_paths):
        # a resume or an export run from elsewhere still finds the files
        meta = {"step": s.step, "phase": s.phase, "epoch": s.epoch, "batch": s.batch,
                "train_config": self.written.to_dict(), "train_cwd": str(self.started_in)}
        if self.features_provenance:  # which front end made the features (export attaches it)
            meta["features_provenance"] = self.features_provenance
        if val is not None:
            meta["val_cider_d"] = val
        return meta

    def _tick(self) -> None:
        now = time.perf_counter()
        self.state.seconds += now - self._clock
        self._clock = now

    def save_last(self) -> None:
        self._tick()
        states = [rng_state()]
        if self.world > 1:
            states = [None] * self.world
            torch.distributed.all_gather_object(states, rng_state())
        if self.is_main:
            meta = self._meta()
            payload = {
                "version": STATE_VERSION,
                "state": asdict(self.state),
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "rng": states,
                **{hook.state_key: hook.state_dict() for hook in self.hooks if hook.state_key},
                "weights": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                "meta": meta,
            }
            # The save commits with the one rename of last.state.pt, which carries the weights
            # too: a kill at any instant leaves either the previous complete save or this one.
            # last.pt (the checkpoint users load) follows; a kill before it is made good on resume.
            save_payload(payload, self.out / "last.state.pt")
            save_checkpoint(self.out / "last.pt", self.model, self.vocab, meta)
        barrier()

    def _load_last(self) -> None:
        saved, self._saved = self._saved, None
        self.model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in saved["weights"].items()})
        self.state = RunState(**saved["state"])
        if len(saved["rng"]) != self.world:
            raise EdgecapError(f"--resume: the run used {len(saved['rng'])} processes, this one has {self.world}")
        for hook in self.hooks:
            if hook.state_key and saved.get(hook.state_key) is not None:
                hook.load_state_dict(saved[hook.state_key])
        self._pending_optimizer_state = saved.get("optimizer")
        self.metrics.truncate_after(self.state.step)
        self._repair_last(saved["meta"])
        if self._lengths_changed:
            self._new_phase_lengths()
        set_rng_state(saved["rng"][self.rank])

    def _new_phase_lengths(self) -> None:
        """--resume with other [schedule] / [scst] epochs or patience: the run goes on under
        them (a finished run too, when they leave it more to do); XE's may not change once SCST
        has started. config.toml then holds the changed config, which later resumes compare with."""
        s, stored = self.state, self.out / "config.toml"
        old = stored_config(stored)
        xe_changed = (old.schedule.epochs, old.schedule.patience) != (self.cfg.schedule.epochs, self.cfg.schedule.patience)
        if s.phase == "scst" and self.cfg.scst.epochs == 0:
            raise EdgecapError("--resume: the run is in SCST; [scst].epochs = 0 would take it back to XE "
                               "(to stop it here, set [scst].patience or a smaller [scst].epochs)")
        if xe_changed and s.phase == "scst":
            raise EdgecapError(f"--resume: the run is in SCST, its XE phase is over; only [scst].epochs and "
                               f"[scst].patience can change now ({self._lengths_changed})")
        s.done = False
        if self.is_main:
            write_text_atomic(stored, self.written.text or to_toml(self.written.to_dict()))
            print(f"edgecap: resuming with {self._lengths_changed}; {stored} updated", file=sys.stderr, flush=True)

    def _repair_last(self, meta: dict) -> None:
        """A kill after last.state.pt committed and before last.pt did leaves last.pt one save
        behind (or absent): write it again from the state's weights, so the run directory
        agrees with itself before anything else happens."""
        if not self.is_main:
            return
        last = self.out / "last.pt"
        if last_is_behind(self.out, self.state.step):
            save_checkpoint(last, self.model, self.vocab, meta)
            print(f"edgecap: {last} was not written by the last save (interrupted); written again from "
                  f"last.state.pt (step {self.state.step})", file=sys.stderr, flush=True)

    def _save_model(self, name: str, val: float, at_stop: bool = False) -> None:
        if self.is_main:
            meta = self._meta(val)
            if at_stop:
                meta["validated_at_stop"] = True
            save_checkpoint(self.out / name, self.model, self.vocab, meta)

    def _checkpoint_at_stop(self) -> None:
        """A --max-steps stop before any validation: validate now and write best.pt, so the run
        always leaves a loadable, validated checkpoint for the next step (export, caption).

        The run's bests are left alone (the next epoch end replaces this best.pt whatever it
        scores), so a resumed run saves exactly what an uninterrupted one would."""
        s = self.state
        if s.best >= 0 or not self.is_main:
            return
        score, captions = self.validate()
        self.metrics.write({"kind": "val", "phase": s.phase, "step": s.step, "epoch": s.epoch, "at_stop": True,
                            "cider_d": score, "samples": captions[: self.cfg.run.val_samples]})
        self._save_model("best.pt", score, at_stop=True)

    # -- phases ----------------------------------------------------------------------------

    def _enter_phase(self, phase: str) -> None:
        cfg, s = self.cfg, self.state
        if s.phase != phase:  # a new phase (never on the resume of a phase in progress)
            line = {"kind": "phase", "phase": phase, "step": s.step}
            if phase == "scst" and (self.out / "best_xe.pt").is_file():
                payload = read_payload(self.out / "best_xe.pt")
                self.model.load_state_dict({k: v.float() if v.is_floating_point() else v
                                            for k, v in payload["state_dict"].items()})
                line.update({"from": "best_xe.pt", "from_epoch": s.best_xe_epoch, "from_cider_d": s.best_xe})
            s.phase, s.epoch, s.batch, s.phase_step, s.log_acc = phase, 0, 0, 0, {}
            s.phase_best, s.phase_best_epoch, s.since_best = -1.0, 0, 0
            self._pending_optimizer_state = None
            if not self._logged(line):
                self.metrics.write(line)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if phase == "xe":
            o = cfg.optim
            self.optimizer = make_optimizer(o.optimizer, params, 0.0, o.betas, o.eps, o.weight_decay)
            self.schedule = xe_schedule(cfg, self.model_cfg.d_model)
            self.grad_clip = o.grad_clip
        else:
            c = cfg.scst
            self.optimizer = make_optimizer(c.optimizer, params, c.lr, c.betas)
            self.schedule = Constant(c.lr)
            self.grad_clip = c.grad_clip
            if getattr(self, "scst", None) is None:
                # Document frequencies of the training captions, once per run.
                self.scst = SCST(self.model, self.vocab, reward_scorer(self.train_refs), self.train_refs,
                                 beam_size=c.beam_size, baseline=c.baseline)
        if self._pending_optimizer_state is not None:
            self.optimizer.load_state_dict(self._pending_optimizer_state)
            self._pending_optimizer_state = None
        self.sampler = EpochBatchSampler(len(self.train_set), self.cfg.batch_size(phase), seed=self.cfg.run.seed,
                                         rank=self.rank, world=self.world, shuffle=True)
        self.loader = torch.utils.data.DataLoader(
            self.train_set, batch_sampler=self.sampler, num_workers=cfg.data.num_workers,
            collate_fn=partial(collate, pad_id=self.vocab.pad_id), generator=torch.Generator(),
        )

    # -- one step ------------------------------------------------------------------------

    def _step(self, batch) -> dict:
        s = self.state
        s.step += 1
        s.phase_step += 1
        lr = self.schedule(s.phase_step)
        set_lr(self.optimizer, lr)
        self.module.train()
        batch = batch.to(self.device)
        record = {"lr": lr}
        if s.phase == "xe":
            loss = xe_step(self.module, batch, self.vocab.pad_id, self.hooks)
        else:
            loss, stats = self.scst.loss(self.module, batch, self.hooks)
            record.update(reward=stats.reward, baseline=stats.baseline,
                          reward_seconds=stats.reward_seconds, search_seconds=stats.search_seconds)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        record["loss"] = float(loss.detach())
        for hook in self.hooks:
            line = hook.after_step(s.step)
            if line is not None:
                self.metrics.write({"kind": hook.name, "step": s.step, **line})
        return record

    def _accumulate(self, record: dict, seconds: float) -> None:
        acc = self.state.log_acc
        for key, value in record.items():
            acc[key] = acc.get(key, 0.0) + value
        acc["_n"] = acc.get("_n", 0) + 1
        acc["_seconds"] = acc.get("_seconds", 0.0) + seconds

    def _flush_log(self) -> None:
        s, acc = self.state, self.state.log_acc
        n = acc.pop("_n", 0)
        seconds = acc.pop("_seconds", 0.0)
        if n:
            line = {"kind": "train", "phase": s.phase, "step": s.step, "epoch": s.epoch, "steps": n}
            line.update({k: v / n for k, v in acc.items()})
            if self.world > 1:  # every rank's share of the batch, not rank 0's alone
                line.update(self._mean_over_ranks({k: line[k] for k in RANK_AVERAGED if k in line}))
            line["lr"] = self.schedule(s.phase_step)
            line["steps_per_s"] = n / seconds if seconds > 0 else None
            self.metrics.write(line)
            if self.is_main and self.progress and not bar_wanted():
                self._progress_line(line)
        s.log_acc = {}

    def _mean_over_ranks(self, values: dict) -> dict:
        keys = sorted(values)
        tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64,
                              device=self.device if self.device.type == "cuda" else "cpu")
        torch.distributed.all_reduce(tensor)
        return {k: float(v) / self.world for k, v in zip(keys, tensor.tolist(), strict=True)}

    def _progress_line(self, line: dict) -> None:
        """Into a log file (no terminal, so no bar): one plain line per metrics line."""
        s = self.state
        per_epoch = self.sampler.batches_per_epoch()
        parts = [f"{s.phase} epoch {s.epoch + (1 if s.batch else 0)}/{self.cfg.phase_epochs(s.phase)}",
                 f"step {s.step} (batch {s.batch or per_epoch}/{per_epoch})", f"loss {line['loss']:.4f}"]
        if "reward" in line:
            parts.append(f"reward {line['reward']:.4f}")
        parts.append(f"lr {line['lr']:.2e}")
        if line.get("steps_per_s"):
            parts.append(f"{line['steps_per_s']:.2f} steps/s")
        print(", ".join(parts), file=sys.stderr, flush=True)

    # -- validation ----------------------------------------------------------------------

    def validate(self, items=None) -> tuple[float, list[str]]:
        """CIDEr-D of the model's captions of the validation images (or `items`, from the same
        source) with [run].val_beam, the beam that selects best.pt."""
        items = self.val_images if items is None else items
        options = DecodeOptions(beam_size=self.cfg.run.val_beam, max_len=self.model_cfg.max_len)
        captions = caption_images(self.model, self.vocab, self.eval_source, items, options,
                                  self.cfg.data.val_batch_size, self.device, self.hooks)
        return ciderd(items, captions), captions

    def _end_epoch(self) -> None:
        s = self.state
        s.epoch += 1
        s.batch = 0
        self._flush_log()
        if self.is_main:
            score, captions = self.validate()
            n = self.cfg.run.val_samples
            if score > s.phase_best:
                s.phase_best, s.phase_best_epoch, s.since_best = score, s.epoch, 0
            else:
                s.since_best += 1
            self.metrics.write({"kind": "val", "phase": s.phase, "step": s.step, "epoch": s.epoch,
                                "cider_d": score, "beam": self.cfg.run.val_beam, "best_epoch": s.phase_best_epoch,
                                "since_best": s.since_best, "patience": self.cfg.patience(s.phase),
                                "samples": captions[:n]})
            if score > s.best:
                s.best = score
                self._save_model("best.pt", score)
            if s.phase == "xe" and score > s.best_xe:
                s.best_xe, s.best_xe_epoch = score, s.epoch
                self._save_model("best_xe.pt", score)
            if self.cfg.run.average_last:
                keep_epoch(self.out, self.model, self.vocab, self._meta(score), s.phase, s.epoch,
                           self.cfg.run.average_last)
            if self.bar is not None and self.progress:
                self.bar.write(f"{s.phase} epoch {s.epoch}: validation CIDEr-D {score:.3f} (best {s.best:.3f})")
        if self.world > 1:
            # Rank 0 alone validated: share the bests so every rank's state (and when a phase
            # runs out of patience) agrees.
            bests = [s.best, s.best_xe, s.best_xe_epoch, s.phase_best, s.phase_best_epoch, s.since_best]
            torch.distributed.broadcast_object_list(bests, src=0)
            s.best, s.best_xe, s.best_xe_epoch, s.phase_best, s.phase_best_epoch, s.since_best = bests
        self.save_last()
        if self.is_main:
            plot_curves(self.metrics.records(), self.out / "curves.png")

    # -- the run -------------------------------------------------------------------------

    def run(self) -> dict:
        self._clock = time.perf_counter()
        self.setup()
        self.bar = None
        stopped = False
        try:
            if self.state.done and not self.test:
                return self.summary(stopped=False)
            if not self.state.done:
                announce(self)
                phases = self.cfg.phases()
                start = phases.index(self.state.phase) if self.state.phase in phases else 0
                for phase in phases[start:]:
                    self._enter_phase(phase)
                    stopped = self._run_phase(phase)
                    if stopped:
                        break
                if not stopped:
                    self._average()
                    self.state.done = True
                    self.save_last()
            if not stopped and self.test:
                self.score_test()
        finally:
            if self.bar is not None:
                self.bar.close()
            self.hooks.close()
        summary = self.summary(stopped)
        if self.is_main:
            write_json_atomic(self.out / "summary.json", summary)
        if self.started_dist:
            torch.distributed.destroy_process_group()
        return summary

    def _run_phase(self, phase: str) -> bool:
        """Train the remaining epochs of `phase`; True when --max-steps stopped the run."""
        s = self.state
        epochs = self.cfg.phase_epochs(phase)
        per_epoch = self.sampler.batches_per_epoch()
        self.bar = progress_bar(total=epochs * per_epoch, initial=s.epoch * per_epoch + s.batch, desc=phase,
                                unit="step", quiet=not (self.progress and self.is_main))
        try:
            while s.epoch < epochs and not self._out_of_patience(phase):
                self.sampler.set_epoch(s.epoch, start=s.batch)
                self.train_set.set_epoch(s.epoch)
                tick = time.perf_counter()
                for batch in self.loader:
                    record = self._step(batch)
                    s.batch += 1
                    now = time.perf_counter()
                    self._accumulate(record, now - tick)
                    tick = now
                    if s.step % self.cfg.run.log_every == 0:
                        self._flush_log()
                    post = {"epoch": s.epoch + 1, "loss": f"{record['loss']:.3f}", "lr": f"{record['lr']:.2e}"}
                    if "reward" in record:
                        post["reward"] = f"{record['reward']:.3f}"
                    self.bar.set_postfix(post, refresh=False)
                    self.bar.update(1)
                    if self.max_steps is not None and s.step >= self.max_steps:
                        self._checkpoint_at_stop()
                        self.save_last()
                        if self.is_main and self.progress:
                            self.bar.write(f"stopped at step {s.step} (--max-steps); continue with --resume")
                        return True
                    if self.cfg.run.save_every and s.step % self.cfg.run.save_every == 0:
                        self.save_last()
                self._end_epoch()
        finally:
            self.bar.close()
            self.bar = None
        self._end_of_phase(phase)
        return False

    @contextlib.contextmanager
    def _weights(self, state_dict: dict):
        """The model with other weights for the length of the block (then its own again)."""
        own = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(state_dict)
        try:
            yield
        finally:
            self.model.load_state_dict(own)

    def _average(self) -> None:
        """[run].average_last: averaged.pt from the final phase's last epoch ends, validated."""
        n = self.cfg.run.average_last
        files = epoch_files(self.out, self.state.phase)[-n:] if n else []
        if not files or not self.is_main:
            return
        with self._weights(average_weights(files)):
            score, captions = self.validate()
            self._save_model("averaged.pt", score)
        line = {"kind": "averaged", "phase": self.state.phase, "step": self.state.step,
                "epochs": [f.stem for f in files], "cider_d": score, "beam": self.cfg.run.val_beam,
                "samples": captions[: self.cfg.run.val_samples]}
        if not self._logged(line):  # a kill before the run's final save repeats this
            self.metrics.write(line)

    def score_test(self) -> None:
        """--test: best.pt's captions of the test split with the validation beam, into
        test_captions.json (COCO results, what `edgecap eval coco` reads) and metrics.jsonl."""
        if not self.is_main:
            barrier()
            return

        with self._weights(load_checkpoint(self.out / "best.pt").model.state_dict()):
            score, captions = self.validate(self.splits.test)
        write_json_atomic(self.out / "test_captions.json", results(self.splits.test, captions))
        self.metrics.write({"kind": "test", "step": self.state.step, "checkpoint": "best.pt",
                            "beam": self.cfg.run.val_beam, "images": len(captions), "cider_d": score,
                            "samples": captions[: self.cfg.run.val_samples]})
        barrier()

    def summary(self, stopped: bool) -> dict:
        s = self.state
        vals = [r for r in self.metrics.records() if r.get("kind") == "val" and not r.get("at_stop")] \
            if self.is_main else []
        xe = [r["cider_d"] for r in vals if r["phase"] == "xe"]
        scst = [r["cider_d"] for r in vals if r["phase"] == "scst"]
        return {"out": str(self.out), "step": s.step, "phase": s.phase, "stopped": stopped, "done": s.done,
                "train_seconds": round(s.seconds, 1),
                "best_val_cider_d": s.best if s.best >= 0 else None,
                "best_xe_val_cider_d": max(xe) if xe else None,
                "best_scst_val_cider_d": max(scst) if scst else None,
                "last_val_cider_d": vals[-1]["cider_d"] if vals else None,
                "karpathy": str(self.karpathy),
                "averaged_val_cider_d": next((r["cider_d"] for r in reversed(self.metrics.records())
                                              if r.get("kind") == "averaged"), None) if self.is_main else None,
                "test_cider_d": next((r["cider_d"] for r in reversed(self.metrics.records()) if r.get("kind") == "test"),
                                     None) if self.is_main else None,
                "model": self.model_cfg.name, "parameters": self.model.num_parameters(), "world_size": self.world,
                "best_checkpoint": self._best_checkpoint() if self.is_main else None}

    def _best_checkpoint(self) -> dict | None:
        """What best.pt holds: step, phase, validation CIDEr-D, whether it was validated at a stop."""
        path = self.out / "best.pt"
        if not path.is_file():
            return None
        meta = read_payload(path).get("meta", {})
        return {"path": str(path), "step": meta.get("step"), "phase": meta.get("phase"),
                "val_cider_d": meta.get("val_cider_d"), "validated_at_stop": bool(meta.get("validated_at_stop")),
                "takes_images": bool(getattr(self.model.visual, "takes_images", False)),
                "features_provenance": meta.get("features_provenance")}


# -- config helpers ------------------------------------------------------------------------

def train(config: str | os.PathLike | TrainConfig, **kwargs) -> dict:
    """Run a training config (path or TrainConfig); keyword arguments as `Trainer`."""
    cfg = config if isinstance(config, TrainConfig) else load_config(config)
    return Trainer(cfg, **kwargs).run()
