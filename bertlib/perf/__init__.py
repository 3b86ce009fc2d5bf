"""Performance (chapter 14): layer 7; imports every layer below it.

- :mod:`~bertlib.perf.timing`: paired, interleaved timings and memory
- :mod:`~bertlib.perf.roofline`: what the hardware allows, per operation
- :mod:`~bertlib.perf.engines`: ONNX Runtime, OpenVINO, CTranslate2, torch.compile ... behind one interface
- :mod:`~bertlib.perf.bench`: the benchmark command (``bertlib-bench``), with its engine
  (:mod:`~bertlib.perf.bench_engines`) and training (:mod:`~bertlib.perf.bench_training`) rows
"""
