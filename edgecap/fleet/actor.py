"""The caption actor of a fleet job: one per GPU or per share of CPUs, each opening the bundle
once (no Ray imported here: Ray Data constructs it and calls it with batches of rows).

It captions frame rows with the runtime's Captioner at the bundle's default beam (or --beam),
scores coverage with the runtime's CoverageAnnotator where objects are known, and builds each
caption's Record and caption-log messages with the runtime's own code (`records.Record`,
`mcap_sink.record_messages`), so a fleet caption log is what `edgecap run --out-mcap` writes
for the same frames. END rows pass through untouched.
"""

from __future__ import annotations

import json
import os
import socket
import time

import numpy as np

from edgecap.metrics.vocabulary import load_vocabulary

from .reading import END, decode_objects


def caption_schema():
    """The rows an actor returns (pyarrow schema)."""
    import pyarrow as pa

    return pa.schema([
        ("unit", pa.int64()), ("topic", pa.string()), ("kind", pa.string()), ("index", pa.int64()),
        ("header_ns", pa.int64()), ("log_ns", pa.int64()), ("header_frame_id", pa.string()),
        ("image_id", pa.string()), ("objects", pa.string()),
        ("caption", pa.string()), ("tokens", pa.list_(pa.int32())), ("beam", pa.int32()),
        ("score", pa.float64()),
        ("coverage", pa.string()),         # JSON {">1%": ..}, null when not scored
        ("mentioned", pa.string()),        # JSON list of coverage matches, null when not scored
        ("messages", pa.string()),         # JSON [log time ns, [[topic, type, fields], ...]]
        ("actor", pa.string()),            # host:pid of the actor that captioned it
        ("busy_s", pa.float64()),          # the actor's time on the row's batch, shared by its rows
        ("done_wall", pa.float64()),       # time.time() when its caption was ready
        ("info", pa.string()),             # END rows: the read task's JSON, passed on
    ])


class CaptionActor:
    """`CaptionActor(bundle, ...)(table) -> table`: Ray Data's map_batches class."""

    def __init__(self, bundle: str, providers: list[str] | None = None, threads: int = 1,
                 beam: int | None = None, coverage: bool = True):
        from edgecap.runtime.captioner import Captioner

        # spin off: an actor's idle intra-op threads would busy-wait on cores the read tasks need
        self.captioner = Captioner.from_bundle(bundle, providers=providers, threads=threads, spin=False)
        self.beam = self.captioner.check_beam(beam) if beam is not None else self.captioner.beam
        self.captioner.warm_up()
        self.coverage = coverage
        self._annotators: dict[str | None, object] = {}
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def _annotator(self, vocabulary: str | None):
        """One coverage scorer per class set (ACVR's, COCO's, a --categories file's), loaded on
        first use: spaCy and GloVe load only in actors that meet objects."""
        annotator = self._annotators.get(vocabulary)
        if annotator is None:
            from edgecap.runtime.scoring import CoverageAnnotator

            classes = None
            if vocabulary is not None:
                classes = load_vocabulary(vocabulary)
            annotator = self._annotators[vocabulary] = CoverageAnnotator(
                self.coverage, log=lambda message: print(f"edgecap fleet actor {self.name}: {message}", flush=True),
                vocabulary=classes)
        return annotator

    def __call__(self, batch):
        import pyarrow as pa

        from edgecap.runtime.camera import Frame
        from edgecap.runtime.mcap_sink import record_messages
        from edgecap.runtime.records import Record
        from edgecap.runtime.sources import LogStamp

        began = time.perf_counter()
        rows = batch.to_pylist()
        frames, kept = [], []
        now_wall, now = time.time(), time.monotonic()
        for row in rows:
            if row["kind"] == END:
                continue
            image = np.frombuffer(row["image"], np.uint8).reshape(row["height"], row["width"], 3)
            stamp = None if row["header_ns"] is None else LogStamp(row["header_ns"], row["log_ns"],
                                                                   row["header_frame_id"] or "")
            # capture = when the read task decoded it: capture_to_caption includes Ray's queues
            frames.append(Frame(image, row["index"], now - (now_wall - row["wall_time"]), row["wall_time"],
                                decode_objects(row["objects"]), row["image_id"], stamp=stamp))
            kept.append(row)
        captions, done = [], []
        for start in range(0, len(frames), self.captioner.batch_size):  # one bundle batch at a time,
            chunk = frames[start:start + self.captioner.batch_size]     # each stamped when it is ready
            captions += self.captioner.caption([f.image for f in chunk], beam=self.beam)
            done += [(time.monotonic(), time.time())] * len(chunk)
        out = []
        for row, frame, caption, (t_done, done_wall) in zip(kept, frames, captions, done, strict=True):
            record = Record(frame, caption, row["source"], t_done)
            scored = self._annotator(row["vocabulary"]).score(caption.text, frame.objects)
            if scored is not None:
                record.coverage, record.matches = scored
            log_ns, messages = record_messages(record)
            out.append({**{k: row[k] for k in ("unit", "topic", "kind", "index", "header_ns", "log_ns",
                                                 "header_frame_id", "image_id", "objects")},
                        "caption": caption.text, "tokens": list(caption.tokens), "beam": caption.beam,
                        "score": caption.score,
                        "coverage": None if record.coverage is None else json.dumps(record.coverage),
                        "mentioned": None if record.coverage is None else json.dumps(record.matches or []),
                        "messages": json.dumps([log_ns, messages]), "actor": self.name,
                        "done_wall": done_wall})
        busy = time.perf_counter() - began
        for row in out:
            row["busy_s"] = busy / len(out)
        out += [{"unit": r["unit"], "topic": r["topic"], "kind": END, "index": r["index"], "info": r["info"]}
                for r in rows if r["kind"] == END]
        return pa.Table.from_pylist(out, schema=caption_schema())
