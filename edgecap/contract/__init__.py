"""The torch-free contract that the model, the exporter and the robot runtime share.

    beam        greedy / beam search over any decoder step (PyTorch, onnxruntime, TensorRT)
    manifest    the bundle schema: export constructs it, the runtime reads it
    objects     objects known to be in a frame and the coverage area each is scored by
    preprocess  image preprocessing (`Preprocessing`), as a model, weights or manifest say
    runlog      the caption log `edgecap run --jsonl` writes, as `eval coverage --records` reads it
    state       a family's decoding state, described once by name (batch / slot axes, per layer)
    vocab       tokenisation, word <-> id, special tokens, token ids -> words

Everything here imports only numpy, OpenCV and the standard library (and edgecap's own errors
and file helpers), so `edgecap.models`, `edgecap.export` and `edgecap.runtime` can all build on
it without importing each other.
"""
