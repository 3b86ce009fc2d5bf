"""Predictions and their scores (chapters 9, 13): layer 5; imports model, variants, data and tasks.

- :mod:`~bertlib.evaluation.inference`: logits in length-sorted batches, accuracy and F1, the validation rule
- :mod:`~bertlib.evaluation.window_classifier`: classifiers over a post's window vectors
- :mod:`~bertlib.evaluation.ensemble`: TF-IDF baselines and their average with the model
- :mod:`~bertlib.evaluation.features`: frozen features and a probe (command ``bertlib-features``)
- :mod:`~bertlib.evaluation.fidelity`: bertlib against Hugging Face over implementations and dtypes
  (command ``bertlib-fidelity``)
"""
