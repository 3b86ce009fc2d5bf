"""What plugs into the forward pass (chapters 12-14): layer 2; imports only :mod:`bertlib.model`.

- :mod:`~bertlib.variants.head_pruning`: head masks, head importance, pruning as transformers 4.x did
- :mod:`~bertlib.variants.relative_position`: relative position embeddings (Shaw et al., Huang et al.)
- :mod:`~bertlib.variants.fast_linear`: prepacked (oneDNN) and int8 Linear weights
- :mod:`~bertlib.variants.numpy_bert`: the forward pass in NumPy
"""
