"""The torch-free contract that training, export and the robot runtime share.

    beam        greedy / beam search over any decoder step (PyTorch, onnxruntime, TensorRT)
    preprocess  image preprocessing exactly as a manifest or VisualConfig says
    vocab       tokenisation, word <-> id, special tokens

Everything here imports only numpy, OpenCV and the standard library, so `edgecap.models`,
`edgecap.export` and `edgecap.runtime` can all build on it without importing each other.
"""
