"""A trainable classifier built from the same functions (chapter 8, *Pooler and classifier head*).

Its ``state_dict()`` uses the parameter names of ``transformers.BertForSequenceClassification``
(``bert.embeddings...``, ``classifier.weight``), so a fine-tuned model exports to Hugging Face unchanged. As in
Hugging Face (``nn.Embedding(..., padding_idx=pad_token_id)``), the ``[PAD]`` row of the word embeddings never
receives a gradient.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig

from bertlib.model.checks import check_config, check_inputs, check_state_dict, expected_shapes
from bertlib.model.encoder import OUTPUTS_ONLY, bert_forward
from bertlib.model.runtime import normal_init, seeded_generator


def module_tree(state_dict: Mapping[str, torch.Tensor]) -> nn.Module:
    """Plain ``nn.Module`` containers nested by the dots of each key, so ``named_parameters()`` gives the same
    names back (``encoder.layer.0.attention.self.query.weight``...): trainable raw weights whose ``state_dict()``
    has Hugging Face's names (:class:`BertClassifier`, :class:`bertlib.training.pretraining.BertPretrainingModel`)."""
    root = nn.Module()
    for name, tensor in state_dict.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, nn.Module())
            module = module._modules[part]
        module.register_parameter(leaf, nn.Parameter(tensor.detach().clone()))
    return root


#: What :class:`BertClassifier`'s linear layer reads: HF's pooler on ``[CLS]``, or the mean of the last hidden states.
HEAD_POOLINGS = ("pooler", "mean")

#: The word-embedding table's name in a :func:`module_tree` of ``BertModel`` keys.
WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"


class _NoGradientAtRow(torch.autograd.Function):
    """Identity forward; backward returns the gradient with row ``row`` set to 0."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, row: int) -> torch.Tensor:
        ctx.row = row
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone()
        grad[ctx.row] = 0
        return grad, None


def padding_row_frozen(weight: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """``weight`` (the word embeddings, ``(vocab, hidden)``) as it is, but with no gradient reaching row
    ``pad_token_id``: what ``nn.Embedding(..., padding_idx=pad_token_id)`` does in Hugging Face's ``BertEmbeddings``.
    Without it, a ``[PAD]`` token whose state reaches the loss (no attention mask, or a pad id inside a text) would
    move the ``[PAD]`` embedding. Returns ``weight`` itself when no gradient is being recorded."""
    if pad_token_id is None or not (weight.requires_grad and torch.is_grad_enabled()):
        return weight
    return _NoGradientAtRow.apply(weight, pad_token_id)


def classifier_dropout_prob(config: BertConfig) -> float:
    """HF's rule for the dropout before a task head (``BertForSequenceClassification`` and the other ``BertFor*``
    classes): ``config.classifier_dropout`` when set, else ``config.hidden_dropout_prob``."""
    p = getattr(config, "classifier_dropout", None)
    return config.hidden_dropout_prob if p is None else p


class BertClassifier(nn.Module):
    """BERT + dropout + a linear layer on the pooled ``[CLS]`` vector: ``logits = W · Dropout(pooler) + b``.
    With ``pooling="mean"`` the layer reads the mean of the last hidden states over the real tokens instead (what a
    sentence encoder such as all-MiniLM-L6-v2 was trained to output; chapter 9 fine-tunes it so): the pooler is not
    used, and the model is no longer ``BertForSequenceClassification`` (:func:`bertlib.tasks.export.to_hf_classifier`
    refuses it).

    ``forward(input_ids, attention_mask, token_type_ids)`` with ``(batch, seq)`` tensors returns
    ``(batch, num_labels)`` logits. Dropout is active in ``train()`` mode and absent in ``eval()`` mode.
    Defined in chapter 8, *Pooler and classifier head*.
    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor],
        config: BertConfig,
        num_labels: int,
        *,
        seed: int | None = None,
        attn_implementation: str = "eager",
        fused: bool = False,
        pooling: str = "pooler",
    ) -> None:
        super().__init__()
        check_config(config)
        if num_labels < 1:
            raise ValueError(f"num_labels must be at least 1, got {num_labels}.")
        if pooling not in HEAD_POOLINGS:
            raise ValueError(f"pooling must be one of {HEAD_POOLINGS}, got {pooling!r}.")
        self.pooling = pooling
        state_dict = {k: v for k, v in state_dict.items() if k in expected_shapes(config)}
        check_state_dict(state_dict, config)
        self.config = config
        self.num_labels = num_labels
        self.attn_implementation = attn_implementation
        self.fused = fused  # one-kernel LayerNorm/GELU (appendix 14): same math, faster
        self.bert = module_tree(state_dict)
        if pooling == "mean":  # the head never reads the pooler: kept for export and resuming, but not trained (a
            for name, weight in self.bert.named_parameters():  # weight without a gradient stalls DDP's all-reduce)
                weight.requires_grad_(not name.startswith("pooler."))
        self._refresh_weights()
        some = next(iter(state_dict.values()))
        self.classifier = nn.Linear(config.hidden_size, num_labels, device=some.device, dtype=some.dtype)
        with torch.no_grad():  # HF's init: N(0, initializer_range), zero bias
            self.classifier.weight.copy_(normal_init(self.classifier.weight.shape, config.initializer_range,
                                                     seeded_generator(seed)))
            self.classifier.bias.zero_()

    @property
    def dropout_prob(self) -> float:
        """The dropout before the classifier: :func:`classifier_dropout_prob` of the config."""
        return classifier_dropout_prob(self.config)

    def _refresh_weights(self) -> None:
        """The ``BertModel``-keyed dict that :func:`bert_forward` reads, built once; again only when the parameters
        may have been replaced (``.to()``/``.half()``, ``load_state_dict(assign=True)``)."""
        self._weights = dict(self.bert.named_parameters())

    def _apply(self, fn, recurse=True):
        result = super()._apply(fn, recurse)
        self._refresh_weights()
        return result

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False):
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._refresh_weights()
        return result

    def pooled(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``(batch, seq)`` ids (and masks) → ``(batch, hidden)``: the vector the new layer reads, the pooler output
        or the mean of the last hidden states over the real tokens (``pooling``), before dropout."""
        words = padding_row_frozen(self._weights[WORD_EMBEDDINGS], getattr(self.config, "pad_token_id", None))
        weights = self._weights if words is self._weights[WORD_EMBEDDINGS] else ChainMap({WORD_EMBEDDINGS: words},
                                                                                           self._weights)
        if not torch.compiler.is_compiling():  # its checks read values (a graph break under torch.compile)
            check_inputs(self.config, input_ids, attention_mask, token_type_ids)  # the weights: in __init__
        out = bert_forward(weights, self.config, input_ids, attention_mask,
                           token_type_ids, training=self.training, attn_implementation=self.attn_implementation,
                           fused=self.fused, **OUTPUTS_ONLY, check=False)
        return out.pooler_output if self.pooling == "pooler" else mean_pool(out.last_hidden_state, attention_mask)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``(batch, seq)`` ids (and masks) → ``(batch, num_labels)`` logits: the new layer on :meth:`pooled`."""
        pooled = F.dropout(self.pooled(input_ids, attention_mask, token_type_ids), self.dropout_prob, self.training)
        return self.classifier(pooled)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``(batch, seq, hidden)`` states → ``(batch, hidden)``: their mean over the positions where ``attention_mask``
    is 1 (every position when it is None), as sentence-transformers pools (chapter 8)."""
    if attention_mask is None:
        return hidden.mean(1)
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)
