"""Tools: layer 9, the top; imports any layer.

- :mod:`~bertlib.tools.convert`: other checkpoints (an ONNX graph, random weights) as Hugging Face folders
  (command ``bertlib-convert``)
"""
