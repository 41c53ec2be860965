"""`edgecap run BUNDLE --detector MODEL.onnx`: an object detector beside the captioner, torch-free.

The detector sees the frames the captioner sees, one batch per round (every camera's frame of a
multi-camera round together), and its objects feed coverage and the annotated outputs exactly
as a `--detections` file's do (`KnownObject`, boxes in the frame's pixels, inclusive).

    detector = Detector.load("yolo11n.onnx", min_score=0.25)
    objects = detector.detect([bgr_frame_a, bgr_frame_b])   # one list of KnownObject per frame

Output layouts (`LAYOUTS`, told apart by the output's shape unless `layout` names one):

    yolo      [B, 4 + classes, anchors]   cx, cy, w, h in input pixels, then class scores:
                                          ultralytics YOLOv8 / 11 / 12 `yolo export format=onnx`,
                                          and Darknet YOLOs converted by tools/darknet_to_onnx.py
    yolov5    [B, anchors, 5 + classes]   cx, cy, w, h, objectness, class scores (score = their
                                          product): YOLOv5 / YOLOv7 `export.py --include onnx`
    end2end   [B, detections, 6]          x1, y1, x2, y2, score, class after the model's own NMS:
                                          YOLOv10, ultralytics `export nms=True`

The image is letterboxed into the graph's input as ultralytics does (aspect kept, grey 114
borders, RGB, 0..1); boxes are mapped back to the frame and clipped to it. Then a score
threshold, one class per box (its best), and class-aware NMS (OpenCV's `NMSBoxesBatched`).

Class names: the ONNX metadata's `names` (ultralytics writes `{0: 'person', ...}`), else a
`--categories` file (a YOLO data.yaml, or a COCO annotation file's categories in id order).
The session is opened with the captioner's providers, threads and spin (engines.open_session).
"""

from __future__ import annotations

import ast
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgecap.contract.objects import KnownObject
from edgecap.data.classes import canonical_class
from edgecap.data.coco_categories import load_categories
from edgecap.errors import EdgecapError
from edgecap.metrics.vocabulary import vocabulary_of

LAYOUTS = ("yolo", "yolov5", "end2end")
DEFAULT_MIN_SCORE = 0.25   # ultralytics' `predict` conf; Darknet's own demo draws from 0.25 too
DEFAULT_IOU = 0.45         # Darknet's / OpenCV's YOLO samples (ultralytics predicts at 0.7)
MAX_DETECTIONS = 300       # per frame, as ultralytics keeps
LETTERBOX_GREY = 114


@dataclass(frozen=True)
class Letterbox:
    """How one frame went into the graph's input: scale, then the left / top border."""

    scale: float
    left: float
    top: float

    @classmethod
    def fit(cls, width: int, height: int, in_w: int, in_h: int) -> Letterbox:
        scale = min(in_w / width, in_h / height)
        new_w, new_h = round(width * scale), round(height * scale)
        # ultralytics' split of an odd border: one pixel more on the right / bottom
        return cls(scale, round((in_w - new_w) / 2 - 0.1), round((in_h - new_h) / 2 - 0.1))

    def into(self, frame: np.ndarray, out: np.ndarray) -> None:
        """Write `frame` (BGR uint8) into `out` ([3, H, W] float32) as RGB in 0..1."""
        import cv2

        height, width = frame.shape[:2]
        new_w, new_h = round(width * self.scale), round(height * self.scale)
        resized = frame if (new_w, new_h) == (width, height) else cv2.resize(
            frame, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
        left, top = int(self.left), int(self.top)
        out.fill(LETTERBOX_GREY / 255.0)
        rgb = resized[..., ::-1].transpose(2, 0, 1)
        np.multiply(rgb, 1.0 / 255.0, out=out[:, top:top + new_h, left:left + new_w], casting="unsafe")

    def to_frame(self, xyxy: np.ndarray, width: int, height: int) -> np.ndarray:
        """Input-pixel boxes [n, 4] back to the frame's pixels, clipped to it."""
        out = np.empty_like(xyxy)
        out[:, 0::2] = np.clip((xyxy[:, 0::2] - self.left) / self.scale, 0.0, float(width))
        out[:, 1::2] = np.clip((xyxy[:, 1::2] - self.top) / self.scale, 0.0, float(height))
        return out


def _cxcywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    half = boxes[:, 2:4] / 2.0
    return np.concatenate([boxes[:, 0:2] - half, boxes[:, 0:2] + half], axis=1)


def candidates(layout: str, row: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One frame's raw output -> (boxes xyxy in input pixels, best score, best class) per box."""
    if layout == "yolo":
        boxes, scores = row[:4].T, row[4:4 + n_classes].T
    elif layout == "yolov5":
        boxes, scores = row[:, :4], row[:, 5:5 + n_classes] * row[:, 4:5]
    else:  # end2end: the model's own NMS has run; rows past its detections are zero
        return row[:, :4].astype(np.float32), row[:, 4].astype(np.float32), row[:, 5].astype(np.int64)
    best = scores.argmax(axis=1)
    return _cxcywh_to_xyxy(boxes.astype(np.float32)), scores[np.arange(len(best)), best].astype(np.float32), best


def class_aware_nms(xyxy: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float,
                    keep_at_most: int = MAX_DETECTIONS) -> np.ndarray:
    """Indices kept by per-class NMS (boxes of different classes never suppress each other),
    best score first."""
    import cv2

    if not len(scores):
        return np.zeros(0, np.int64)
    xywh = np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], axis=1)
    kept = cv2.dnn.NMSBoxesBatched(xywh.tolist(), scores.tolist(), classes.tolist(), 0.0, float(iou))
    kept = np.asarray(kept, np.int64).reshape(-1)
    return kept[np.argsort(-scores[kept], kind="stable")][:keep_at_most]


def metadata_names(metadata: dict[str, str]) -> dict[int, str] | None:
    """ultralytics' `names` metadata (`str(dict)`: "{0: 'person', 1: 'bicycle'}"), or None."""
    text = metadata.get("names")
    if not text:
        return None
    try:
        names = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    if isinstance(names, (list, tuple)):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not all(isinstance(k, int) and isinstance(v, str) for k, v in names.items()):
        return None
    return dict(sorted(names.items()))


def _static_size(value, metadata: dict[str, str], axis: int, where: str) -> int:
    if isinstance(value, int) and value > 0:
        return value
    imgsz = metadata.get("imgsz")  # a dynamic export still records the size it was made for
    try:
        sizes = ast.literal_eval(imgsz) if imgsz else None
    except (ValueError, SyntaxError):
        sizes = None
    if isinstance(sizes, (list, tuple)) and len(sizes) == 2 and all(isinstance(s, int) for s in sizes):
        return sizes[axis]
    raise EdgecapError(f"{where}: the input's {'height' if axis == 0 else 'width'} is dynamic and the "
                       "metadata has no imgsz; export the detector with a fixed image size")


def detect_layout(shape: list, n_classes: int | None, where: str) -> str:
    """The output layout of a detector from its output shape [B, a, b] and, when its names are
    known, its class count (a = 4 + classes: yolo; b = 5 + classes: yolov5; b = 6: end2end)."""
    expected = ("expected one of [B, 4 + classes, anchors] (ultralytics YOLO), [B, anchors, 5 + classes] "
                "(YOLOv5), [B, detections, 6] (end-to-end)")
    if len(shape) != 3 or not all(isinstance(d, int) for d in shape[1:]):
        raise EdgecapError(f"{where}: output shape {shape} is not a detector's [batch, a, b]; {expected}")
    _, a, b = shape
    if n_classes is not None:
        fits = {"yolo": a == 4 + n_classes, "yolov5": b == 5 + n_classes, "end2end": b == 6}
        for layout in ("yolo", "yolov5", "end2end") if a <= b else ("yolov5", "end2end", "yolo"):
            if fits[layout]:
                return layout
    # no names yet, or none fits them (the caller says which count disagrees): the usual proportions
    return "end2end" if b == 6 and a > b else "yolo" if a < b else "yolov5"


class Detector:
    """An ONNX object detector: BGR frames -> [KnownObject] per frame, and its last latency."""

    def __init__(self, session, path: Path, names: dict[int, str] | None = None, layout: str | None = None,
                 min_score: float = DEFAULT_MIN_SCORE, iou: float = DEFAULT_IOU, area: str = "box",
                 names_origin: str = ""):
        self.session = session
        self.path = Path(path)
        where = f"--detector {self.path}"
        metadata = dict(session.get_modelmeta().custom_metadata_map)
        inputs, outputs = session.get_inputs(), session.get_outputs()
        if len(inputs) != 1:
            raise EdgecapError(f"{where}: takes {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
                               "a detector takes one image tensor")
        shape = list(inputs[0].shape)
        if len(shape) != 4 or shape[1] != 3:
            raise EdgecapError(f"{where}: input {inputs[0].name!r} has shape {shape}, expected [batch, 3, height, width]")
        if inputs[0].type != "tensor(float)":
            raise EdgecapError(f"{where}: input {inputs[0].name!r} is {inputs[0].type}; expected float images")
        self.input_name = inputs[0].name
        self.output_name = outputs[0].name
        self.height = _static_size(shape[2], metadata, 0, where)
        self.width = _static_size(shape[3], metadata, 1, where)
        self.batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else None  # None: any batch
        if names is None:
            names, names_origin = metadata_names(metadata), f"{self.path} metadata"
        out_shape = list(outputs[0].shape)
        self.layout = layout or detect_layout(out_shape, None if names is None else len(names), where)
        if self.layout not in LAYOUTS:
            raise EdgecapError(f"{where}: layout {self.layout!r}: expected one of {', '.join(LAYOUTS)}")
        width = out_shape[1] if self.layout == "yolo" else out_shape[2]
        n_classes = {"yolo": width - 4 if isinstance(width, int) else None,
                     "yolov5": width - 5 if isinstance(width, int) else None, "end2end": None}[self.layout]
        if names is None:
            raise EdgecapError(f"{where}: no class names: its metadata has no 'names' (ultralytics writes them); "
                               "give --categories data.yaml")
        if n_classes is not None and len(names) != n_classes:
            raise EdgecapError(f"{where}: the output {out_shape} holds {n_classes} class scores, and {names_origin} "
                               f"names {len(names)} classes")
        if sorted(names) != list(range(len(names))):
            raise EdgecapError(f"{where}: class names from {names_origin} are not numbered 0..{len(names) - 1}")
        self.n_classes = len(names)
        self.names = {i: canonical_class(n) for i, n in names.items()}
        self.names_origin = names_origin
        self.min_score = float(min_score)
        self.iou = float(iou)
        self.area = area
        self._images = np.zeros((self.batch or 1, 3, self.height, self.width), np.float32)
        self.latency_ms = 0.0  # of the last detect() call (every frame of its batch)

    @classmethod
    def load(cls, path, providers=None, threads: int = 0, spin: bool = True, categories=None,
             layout: str | None = None, min_score: float = DEFAULT_MIN_SCORE, iou: float = DEFAULT_IOU,
             area: str = "box") -> Detector:
        """Open `path` with the captioner's onnxruntime settings. `categories`: a
        `data.coco_categories.Categories` whose names replace the metadata's."""
        from .engines import open_session

        path = Path(path).expanduser()
        if not path.is_file():
            raise EdgecapError(f"--detector {path}: no such file (an ONNX object detector, e.g. `yolo export "
                               "format=onnx`'s yolo11n.onnx)")
        names, origin = None, ""
        if categories is not None:
            indexed = categories.indexed(0) if not getattr(categories, "yolo_indices", False) else categories
            names, origin = dict(indexed.names), categories.origin
        session = open_session(path, providers, threads=threads, spin=spin)
        return cls(session, path, names, layout, min_score, iou, area, origin)

    @property
    def classes(self) -> list[str]:
        """Its class names in index order: the set coverage reads captions against."""
        return [self.names[i] for i in range(self.n_classes)]

    def warm_up(self) -> None:
        """One run on the zero buffer: session start-up is not the first frame's."""
        self._images[:] = 0.0
        self.session.run([self.output_name], {self.input_name: self._images})

    def detect(self, frames: list[np.ndarray]) -> list[list[KnownObject]]:
        """Objects of each BGR frame, in one batch (or the graph's static batch at a time)."""
        start = time.perf_counter()
        step = self.batch or max(1, len(frames))
        out: list[list[KnownObject]] = []
        for first in range(0, len(frames), step):
            out += self._detect_batch(frames[first:first + step])
        self.latency_ms = (time.perf_counter() - start) * 1e3
        return out

    def _detect_batch(self, frames: list[np.ndarray]) -> list[list[KnownObject]]:
        if self.batch is None and len(frames) != len(self._images):
            self._images = np.zeros((len(frames), 3, self.height, self.width), np.float32)
        boxes = []
        for i, frame in enumerate(frames):
            height, width = frame.shape[:2]
            box = Letterbox.fit(width, height, self.width, self.height)
            box.into(frame, self._images[i])
            boxes.append(box)
        self._images[len(frames):] = 0.0  # padding rows of a static batch: computed, never read
        raw = self.session.run([self.output_name], {self.input_name: self._images})[0]
        return [self._objects(raw[i], boxes[i], frame.shape[1], frame.shape[0]) for i, frame in enumerate(frames)]

    def _objects(self, row: np.ndarray, letterbox: Letterbox, width: int, height: int) -> list[KnownObject]:
        xyxy, scores, classes = candidates(self.layout, row, self.n_classes)
        keep = (scores >= self.min_score) & (classes >= 0) & (classes < self.n_classes)
        xyxy, scores, classes = xyxy[keep], scores[keep], classes[keep]
        # NMS on the graph's boxes, then back to the frame and clipped: ultralytics' order, so the
        # same boxes survive as in its own `predict` (clipping first would raise some overlaps)
        kept = class_aware_nms(xyxy, scores, classes, self.iou)
        xyxy, classes = letterbox.to_frame(xyxy[kept], width, height), classes[kept]
        objects = []
        for (x1, y1, x2, y2), cls in zip(xyxy.tolist(), classes.tolist(), strict=True):
            if x2 <= x1 or y2 <= y1:
                continue  # nothing of it inside the frame (a box in the letterbox's border)
            # the continuous box [x1, x2) as an inclusive pixel box, as COCO results become one
            # (runtime/coco_results.py): its area is w * h
            objects.append(KnownObject.measured(self.names[int(cls)], (x1, y1, max(x1, x2 - 1.0), max(y1, y2 - 1.0)),
                                                None, width, height, self.area))
        return objects

    def report(self) -> dict:
        """What the run's summary says about the detector."""
        return {"path": str(self.path), "layout": self.layout, "classes": self.n_classes,
                "names": self.names_origin, "input": [self.batch, 3, self.height, self.width],
                "min_score": self.min_score, "iou": self.iou}


class DetectorHook:
    """The run loop's object hook (loop.run_loop's `annotate_objects`) for a detector: a batch of
    frames -> each frame's objects; the loop records its time as the frames' "detector" latency."""

    latency_key = "detector"

    def __init__(self, detector: Detector):
        self.detector = detector

    def __call__(self, frames) -> list[list[KnownObject]]:
        return self.detector.detect([frame.image for frame in frames])


def coverage_vocabulary(detector: Detector):
    """The class set coverage reads captions against: the detector's classes."""
    return vocabulary_of(detector.classes, detector.names_origin)


def open_detector(settings):
    """`edgecap run`'s --detector (command.RunSettings), opened with the captioner's onnxruntime
    settings, or None; a detector option without it, or beside --detections, is one line."""
    if not settings.detector:
        if settings.nms_iou is not None:
            raise EdgecapError("--nms-iou applies to a --detector; none was given")
        return None
    if settings.detections:
        raise EdgecapError("--detector and --detections both give the frames' objects; give one of them")
    if settings.category_base is not None:
        raise EdgecapError("--category-base applies to a --detections file's category ids; a --detector's "
                           "classes are indices from 0")
    categories = None
    if settings.categories:
        categories = load_categories(settings.categories)
    return Detector.load(settings.detector, providers=settings.providers, threads=settings.threads,
                         spin=settings.spin, categories=categories,
                         min_score=DEFAULT_MIN_SCORE if settings.min_score is None else settings.min_score,
                         iou=DEFAULT_IOU if settings.nms_iou is None else settings.nms_iou, area=settings.area)
