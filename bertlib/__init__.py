"""bertlib: BERT's forward pass rebuilt from raw weights, one function per step of *BERT, Taken Apart*.

Each function names the chapter that derives it; the names follow Hugging Face's ``modeling_bert.py``.

``import bertlib`` loads the forward pass (:mod:`bertlib.model`) and nothing else; its public names are offered
here, where the chapters read them (``bertlib.bert_forward``, ``bertlib.load_pretrained``, ``bertlib.tolerance``).
Every other name is imported from the one module that defines it, in a sub-package by role. The sub-packages form
layers (:data:`LAYERS`, lowest first): a module imports only from its own sub-package or a lower one, never from a
higher one (``tests/test_architecture.py`` checks every import, function-local ones included).
"""

from bertlib.model.attention import attention_head, causal_attention_mask, extended_attention_mask, head_slice
from bertlib.model.attention_functions import ATTENTION_FUNCTIONS, get_attention_function
from bertlib.model.checks import check_config, check_inputs, check_state_dict, expected_shapes
from bertlib.model.embeddings import embeddings
from bertlib.model.encoder import BertForwardOutput, bert_forward, encoder
from bertlib.model.layer import activation, attention_output, encoder_layer, feed_forward, gelu, gelu_tanh
from bertlib.model.layer_norm import layer_norm
from bertlib.model.multi_head import self_attention, transpose_for_scores
from bertlib.model.options import AttentionKwargs, ForwardOptions
from bertlib.model.pooler import pooler
from bertlib.model.pretrained import (
    Pretrained,
    default_model_path,
    load_pretrained,
    max_length,
    split_bert_state_dict,
    to_hf_model,
)
from bertlib.model.runtime import get_device, get_profile, set_seed, tolerance

__version__ = "0.1.0"

#: The sub-packages, lowest layer first. A module may import from its own sub-package and from those before it.
LAYERS: tuple[str, ...] = (
    "model",       # the forward pass: weights, embeddings, attention, the layer loop, pooler; device, seeds, tolerances
    "variants",    # what plugs into it: head pruning, relative positions, packed and int8 weights, BERT in NumPy
    "data",        # 20 Newsgroups, sentences, batches, windows, pre-training data; files written atomically
    "tasks",       # heads on the encoder: the classifier, MLM/NSP/tagging/QA heads, the pipeline, export to HF
    "evaluation",  # predictions and their scores, ensembles, frozen features, fidelity against HF
    "training",    # fine-tuning (the run, its checkpoints, DDP) and pre-training
    "perf",        # timing, the roofline, inference engines, the benchmarks
    "course",      # the book's helpers: setup(), claims, exercises, quizzes, notebook views, the why-experiments
    "tools",       # convert: other checkpoints into Hugging Face folders
)

__all__ = [
    "ATTENTION_FUNCTIONS", "AttentionKwargs", "BertForwardOutput", "ForwardOptions", "LAYERS", "Pretrained",
    "activation", "attention_head", "attention_output", "bert_forward", "causal_attention_mask", "check_config",
    "check_inputs", "check_state_dict", "default_model_path", "embeddings", "encoder", "encoder_layer",
    "expected_shapes", "extended_attention_mask", "feed_forward", "gelu", "gelu_tanh", "get_attention_function",
    "get_device", "get_profile", "head_slice", "layer_norm", "load_pretrained", "max_length", "pooler",
    "self_attention", "set_seed", "split_bert_state_dict", "to_hf_model", "tolerance", "transpose_for_scores",
]
