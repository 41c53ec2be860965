"""Small object detectors in the ONNX layouts `edgecap run --detector` reads, made with onnx's
own helpers: a random-weight convolution (its features reach the output through a zero
weight, so onnxruntime runs a real backbone) and a fixed head that writes known boxes.

The head's scores are scaled by the image's mean brightness (0..1 after the detector's own
preprocessing): a white frame gets the scores as given, a black one none, so a batch of
different frames shows that every row is its own image.
"""

from __future__ import annotations

import numpy as np

NAMES = {0: "person", 1: "cup", 2: "tvmonitor"}


def _head(layout: str, boxes: list[tuple[int, tuple[float, float, float, float], float]], n_classes: int):
    """(constant head [1, ...], score mask [1, ...]) for `boxes` = [(class, (cx, cy, w, h) in
    input pixels, score)]; for end2end the box is (x1, y1, x2, y2)."""
    n = max(len(boxes), 16)  # unused anchors score 0; 16 keep [B, 4 + 3, n] and [B, n, 5 + 3] apart
    if layout == "yolo":
        head = np.zeros((1, 4 + n_classes, n), np.float32)
        for a, (cls, box, score) in enumerate(boxes):
            head[0, :4, a] = box
            head[0, 4 + cls, a] = score
        mask = np.zeros((1, 4 + n_classes, 1), np.float32)
        mask[0, 4:] = 1.0
    elif layout == "yolov5":
        head = np.zeros((1, n, 5 + n_classes), np.float32)
        for a, (cls, box, score) in enumerate(boxes):
            head[0, a, :4] = box
            head[0, a, 4] = score        # objectness
            head[0, a, 5 + cls] = 1.0    # class probability
        mask = np.zeros((1, 1, 5 + n_classes), np.float32)
        mask[0, 0, 4] = 1.0
    else:  # end2end
        head = np.zeros((1, n, 6), np.float32)
        for a, (cls, box, score) in enumerate(boxes):
            head[0, a] = (*box, score, cls)
        mask = np.zeros((1, 1, 6), np.float32)
        mask[0, 0, 4] = 1.0
    return head, mask


def write_detector(path, boxes, layout: str = "yolo", size=(320, 320), batch: int | str = 1,
                   names: dict[int, str] | None = NAMES, seed: int = 0, gated: bool = True) -> None:
    """An ONNX detector at `path`: input `images` [batch, 3, H, W] (an int, or a name for a
    dynamic batch), output `output0` in `layout` holding `boxes`, scores x brightness (`gated`)
    or as given."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n_classes = len(names) if names else 3
    head, mask = _head(layout, boxes, n_classes)
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    init = [numpy_helper.from_array(a, name) for a, name in (
        (weights, "conv_w"), (head, "head"), (mask, "score_mask"), (1.0 - mask, "box_mask"),
        (np.array([-1, 1, 1], np.int64), "gate_shape"), (np.zeros(1, np.float32), "zero"),
        (np.array([1.0 if gated else 0.0], np.float32), "gate_weight"),
        (np.array([0.0 if gated else 1.0], np.float32), "gate_bias"))]
    nodes = [
        helper.make_node("Conv", ["images", "conv_w"], ["conv"], strides=[4, 4], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("GlobalAveragePool", ["relu"], ["pooled"]),
        helper.make_node("ReduceMean", ["pooled"], ["feature"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("Reshape", ["feature", "gate_shape"], ["feature3"]),
        helper.make_node("Mul", ["feature3", "zero"], ["unused"]),              # the backbone, weighted 0
        helper.make_node("ReduceMean", ["images"], ["brightness"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("Reshape", ["brightness", "gate_shape"], ["gate0"]),
        helper.make_node("Mul", ["gate0", "gate_weight"], ["gate1"]),
        helper.make_node("Add", ["gate1", "gate_bias"], ["gate2"]),             # brightness, or 1 ungated
        helper.make_node("Add", ["gate2", "unused"], ["gate"]),                 # [B, 1, 1]
        helper.make_node("Mul", ["score_mask", "gate"], ["scaled_mask"]),
        helper.make_node("Add", ["scaled_mask", "box_mask"], ["factor"]),      # boxes x 1, scores x gate
        helper.make_node("Mul", ["head", "factor"], ["output0"]),
    ]
    height, width = size
    out_shape = [batch, *head.shape[1:]]
    graph = helper.make_graph(nodes, "edgecap-test-detector",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, 3, height, width])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, out_shape)], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if names is not None:
        entry = model.metadata_props.add()
        entry.key, entry.value = "names", str(names)
    entry = model.metadata_props.add()
    entry.key, entry.value = "imgsz", str([height, width])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
