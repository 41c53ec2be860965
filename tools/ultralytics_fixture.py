"""Make tests/data/ultralytics/: a tiny YOLO11 exported by ultralytics itself, and what ultralytics'
own `predict` finds with it on two scikit-image photos (tests/test_detector.py reads both).

    python tools/ultralytics_fixture.py --out tests/data/ultralytics

Run it where ultralytics is installed (a scratch venv: `pip install --no-deps ultralytics
ultralytics-thop` beside torch, onnx, onnxruntime, opencv, PyYAML, scikit-image); edgecap never
installs it (it pulls opencv-python, which would shadow opencv-python-headless). Nothing is
downloaded: the network is ultralytics' own yolo11.yaml at a tiny width (0.0625, 3 classes),
random weights (seed 0), BatchNorm statistics from noise images and the class head rescaled so
that scores differ between boxes (a fresh head scores every box alike).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

PHOTOS = ("coffee.png", "astronaut.png")
NAMES = {0: "person", 1: "cup", 2: "tv"}
IMGSZ, CONF, IOU = 160, 0.25, 0.45


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    os.environ["YOLO_OFFLINE"] = "1"
    import cv2
    import skimage
    import torch
    import ultralytics
    import yaml
    from ultralytics import YOLO

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = yaml.safe_load((Path(ultralytics.__file__).parent / "cfg/models/11/yolo11.yaml").read_text())
    cfg.update(nc=len(NAMES), scales={"n": [0.33, 0.0625, 16]})
    yaml_path = out / "tiny11n.yaml"  # the "n" in the name picks the scale
    yaml_path.write_text(yaml.safe_dump(cfg))
    torch.manual_seed(0)
    model = YOLO(str(yaml_path))
    yaml_path.unlink()
    model.model.names = dict(NAMES)
    for module in model.model.modules():
        if type(module).__name__ == "Detect":
            for head in module.cv3:
                head[-1].bias.data.normal_(-2.0, 1.0)
                head[-1].weight.data.mul_(0.3)
    norms = [m for m in model.model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.model.train()
    with torch.no_grad():
        model.model(torch.rand(8, 3, IMGSZ, IMGSZ))
    model.model.eval()
    exported = Path(model.export(format="onnx", imgsz=IMGSZ, simplify=False, dynamic=False, batch=2))
    onnx_path = out / "yolo11-tiny-random.onnx"
    exported.replace(onnx_path)
    folder = Path(skimage.__file__).parent / "data"
    images = [cv2.imread(str(folder / n)) for n in PHOTOS]
    results = YOLO(str(onnx_path), task="detect").predict(images, conf=CONF, iou=IOU, imgsz=IMGSZ, verbose=False)
    doc = {"ultralytics": ultralytics.__version__, "conf": CONF, "iou": IOU, "imgsz": IMGSZ,
           "onnx_sha256": hashlib.sha256(onnx_path.read_bytes()).hexdigest(), "photos": {}}
    for name, r in zip(PHOTOS, results, strict=True):
        boxes = r.boxes
        doc["photos"][name] = {
            "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest(),
            "detections": [{"class": r.names[int(c)], "score": round(float(s), 5), "box": [round(float(v), 3) for v in b]}
                           for b, s, c in zip(boxes.xyxy.tolist(), boxes.conf.tolist(), boxes.cls.tolist(), strict=True)]}
    (out / "yolo11-tiny-random.predictions.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {onnx_path} and its predictions ({', '.join(f'{n}: {len(d)}' for n, d in zip(PHOTOS, results, strict=True))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
