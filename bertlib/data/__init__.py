"""Data (chapters 9-11): layer 3; imports :mod:`bertlib.model` only.

- :mod:`~bertlib.data.corpus`: 20 Newsgroups offline (:func:`load_20newsgroups`), example sentences
- :mod:`~bertlib.data.batches`: padding, length-sorted batches, an epoch's batches
- :mod:`~bertlib.data.newsgroups`: a run's posts (:func:`load_data`, explicit sizes and seed) and their token ids
- :mod:`~bertlib.data.windows`: whole posts as overlapping windows, and their logits pooled back per post
- :mod:`~bertlib.data.pretraining_data`: MLM masking and NSP pairs
- :mod:`~bertlib.data.files`: files written atomically
"""
