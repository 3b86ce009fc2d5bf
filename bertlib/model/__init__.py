"""The forward pass (chapters 1-8): layer 1 of bertlib, the lowest; it imports no other sub-package.

- :mod:`~bertlib.model.runtime`: device, profile, seeds, tolerances, threads (:func:`configure`, :func:`tolerance`)
- :mod:`~bertlib.model.checks`: the checks every step runs on configs, inputs and weights
- :mod:`~bertlib.model.options`: how a pass runs, one frozen :class:`~bertlib.model.options.ForwardOptions` that
  every step below :func:`bertlib.bert_forward` takes (attention by name, fused kernels, training, checks, outputs,
  and the attention function's typed extras, :class:`~bertlib.model.options.AttentionKwargs`)
- :mod:`~bertlib.model.embeddings`, :mod:`~bertlib.model.layer_norm`, :mod:`~bertlib.model.attention`
  (one head), :mod:`~bertlib.model.multi_head` (all heads), :mod:`~bertlib.model.attention_functions` (eager, sdpa,
  unpadded: chosen by name), :mod:`~bertlib.model.relative_scores`, :mod:`~bertlib.model.layer` (the encoder
  layer), :mod:`~bertlib.model.encoder` (the layer loop, :func:`bert_forward`), :mod:`~bertlib.model.pooler`
- :mod:`~bertlib.model.pretrained`: weights and tokenizer from a checkpoint (:func:`load_pretrained`)

``import bertlib`` loads this sub-package only and offers its public names at the top (``bertlib.bert_forward``).
"""
