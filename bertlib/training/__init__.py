"""Training (chapters 9, 11): layer 6; imports every layer below it.

- :mod:`~bertlib.training.finetune`: the fine-tuning run (command ``bertlib-finetune``), with its settings
  (:mod:`~bertlib.training.finetune_config`), state (:mod:`~bertlib.training.finetune_state`), report
  (:mod:`~bertlib.training.finetune_report`), checkpoints (:mod:`~bertlib.training.checkpoint`) and DDP
  (:mod:`~bertlib.training.distributed`)
- :mod:`~bertlib.training.optimization`: AdamW groups and the warm-up schedule
- :mod:`~bertlib.training.pretraining`: MLM + NSP pre-training from scratch
- :mod:`~bertlib.training.small_bert`: chapter 11b's small BERT (its recipe), reused by chapter 15
"""
