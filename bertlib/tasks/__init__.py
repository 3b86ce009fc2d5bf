"""Task heads on the encoder (chapters 8, 10, 11, 15): layer 4; imports model and data.

- :mod:`~bertlib.tasks.classifier`: :class:`BertClassifier`, the module fine-tuning trains
- :mod:`~bertlib.tasks.heads`: MLM, NSP, token classification, QA and multiple-choice heads as functions
- :mod:`~bertlib.tasks.pipeline`: ``pipeline("text-classification")`` by hand
- :mod:`~bertlib.tasks.span_tasks`, :mod:`~bertlib.tasks.tagging`: extractive QA and named entities
- :mod:`~bertlib.tasks.export`: a classifier as a Hugging Face ``BertForSequenceClassification``
"""
