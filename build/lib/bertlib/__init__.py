"""bertlib: BERT's forward pass rebuilt from raw weights, one function per step of *BERT, Taken Apart*.

Each function names the chapter that derives it; the names follow Hugging Face's ``modeling_bert.py``.
"""

from . import data as data  # the module, re-exported (bertlib.data)
from .attention import attention_head, causal_attention_mask, extended_attention_mask, head_slice
from .attention_functions import ATTENTION_FUNCTIONS, get_attention_function
from .checks import check_config, check_inputs, check_state_dict, expected_shapes
from .classifier import BertClassifier
from .embeddings import embeddings
from .encoder import BertForwardOutput, bert_forward, encoder
from .layer import activation, attention_output, encoder_layer, feed_forward, gelu, gelu_tanh
from .layer_norm import layer_norm
from .multi_head import self_attention, transpose_for_scores
from .pooler import pooler
from .pretrained import (
    Pretrained,
    default_model_path,
    load_pretrained,
    max_length,
    split_bert_state_dict,
    to_hf_model,
)
from .runtime import get_device, get_profile, set_seed, setup, tolerance

__version__ = "0.1.0"

__all__ = [
    "ATTENTION_FUNCTIONS", "BertClassifier", "BertForwardOutput", "Pretrained", "activation", "attention_head",
    "attention_output", "bert_forward", "causal_attention_mask", "check_config", "check_inputs", "check_state_dict",
    "default_model_path", "embeddings", "encoder", "encoder_layer", "expected_shapes", "extended_attention_mask",
    "feed_forward", "gelu", "gelu_tanh", "get_attention_function", "get_device", "get_profile", "head_slice",
    "layer_norm", "load_pretrained", "max_length", "pooler", "self_attention", "set_seed", "setup",
    "split_bert_state_dict", "to_hf_model", "tolerance", "transpose_for_scores",
]
