"""Every config field and argument ``transformers.BertModel`` honours, honoured by ``bertlib.bert_forward``:
``is_decoder`` (a causal mask), the optional pooler (``add_pooling_layer=False``, ``BertFor...`` state dicts),
``position_ids``, ``config.pruned_heads`` of a saved pruned checkpoint, pruning as HF 4.x did it (original head
numbers, negative layer indices; transformers 5 removed ``prune_heads``, so the reference is 4.x's algorithm,
transcribed below from ``transformers/pytorch_utils.py`` and ``BertAttention.prune_heads``), and a clear refusal of
what is out of scope (cross-attention). Every attention function (eager, sdpa, head_loop, unpadded) runs each."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from torch.testing import assert_close
from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification

import bertlib
from bertlib.variants import head_pruning as HP
from helpers import random_inputs, random_model

F64 = bertlib.tolerance("cpu", torch.float64)
F32 = bertlib.tolerance("cpu", torch.float32)
IMPLS = ["eager", "sdpa", "head_loop", "unpadded"]


@pytest.mark.parametrize("impl", IMPLS)
def test_is_decoder_is_causal_like_transformers(impl):
    """config.is_decoder=True: BertModel applies a causal mask (create_causal_mask); so does bert_forward, and
    the result differs from the bidirectional one (it is not silently ignored)."""
    sd, config, model = random_model(seed=21, dtype=torch.float64, is_decoder=True)
    batch = random_inputs(config, batch=3, seq=9, seed=22)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = model(**batch, use_cache=False)
    ours = bertlib.bert_forward(sd, config, **batch, attn_implementation=impl)
    assert_close(ours.last_hidden_state[real], ref.last_hidden_state[real], **F64)
    assert_close(ours.pooler_output, ref.pooler_output, **F64)
    both_ways = bertlib.bert_forward(sd, BertConfig(**{**config.to_dict(), "is_decoder": False}), **batch)
    assert (both_ways.last_hidden_state[real] - ours.last_hidden_state[real]).abs().max() > 1e-3
    # causality: the first token's state does not depend on the tokens after it
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    changed["input_ids"][:, 1:] = (changed["input_ids"][:, 1:] + 1) % config.vocab_size
    again = bertlib.bert_forward(sd, config, **changed, attn_implementation=impl)
    assert_close(again.last_hidden_state[:, 0], ours.last_hidden_state[:, 0], **F64)


def test_causal_mask_values():
    mask = bertlib.causal_attention_mask(3, torch.tensor([[1, 1, 0]]), torch.float32)
    allowed = (mask == 0)[0, 0].int().tolist()
    assert allowed == [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    assert mask.shape == (1, 1, 3, 3) and mask.min() == torch.finfo(torch.float32).min


@pytest.mark.parametrize("impl", IMPLS)
def test_position_ids_like_transformers(impl):
    sd, config, model = random_model(seed=23, dtype=torch.float64)
    batch = random_inputs(config, batch=2, seq=8, seed=24)
    real = batch["attention_mask"].bool()
    g = torch.Generator().manual_seed(0)
    for positions in (torch.randint(0, config.max_position_embeddings, (2, 8), generator=g),  # per row
                      torch.arange(3, 11)[None]):  # (1, seq): shared, e.g. a continuation
        with torch.no_grad():
            ref = model(**batch, position_ids=positions)
        ours = bertlib.bert_forward(sd, config, **batch, position_ids=positions, attn_implementation=impl)
        assert_close(ours.last_hidden_state[real], ref.last_hidden_state[real], **F64)
    default = bertlib.bert_forward(sd, config, **batch, position_ids=torch.arange(8))
    assert_close(default.last_hidden_state, bertlib.bert_forward(sd, config, **batch).last_hidden_state,
                 atol=0.0, rtol=0.0)


@pytest.mark.parametrize("head_class", [BertForMaskedLM, BertForTokenClassification, BertForSequenceClassification])
def test_bert_for_state_dicts_split_and_optional_pooler(head_class):
    """split_bert_state_dict takes any BertFor... state dict; without a pooler (add_pooling_layer=False in
    BertForMaskedLM / BertForTokenClassification) pooler_output is None, as model.bert(...) gives."""
    _, config, _ = random_model(seed=25)
    torch.manual_seed(0)
    model = head_class(BertConfig(**{**config.to_dict(), "num_labels": 3})).eval()
    encoder_sd, head_sd = bertlib.split_bert_state_dict(model.state_dict())
    assert head_sd and all(not k.startswith("bert.") for k in head_sd)
    assert not any(k.startswith("bert.") or "position_ids" in k for k in encoder_sd)
    batch = random_inputs(config, batch=2, seq=7, seed=26)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = model.bert(**batch)
    ours = bertlib.bert_forward(encoder_sd, config, **batch)
    assert_close(ours.last_hidden_state[real], ref.last_hidden_state[real], **F32)
    if ref.pooler_output is None:
        assert ours.pooler_output is None
        with pytest.raises(ValueError, match="pooler.dense.weight"):
            bertlib.bert_forward(encoder_sd, config, **batch, add_pooling_layer=True)
    else:
        assert_close(ours.pooler_output, ref.pooler_output, **F32)
        assert bertlib.bert_forward(encoder_sd, config, **batch, add_pooling_layer=False).pooler_output is None


def test_prefixed_state_dict_error_is_short():
    """The issue's case: a 2-layer BertFor... state dict used to give ~1,800 characters listing every key."""
    _, config, _ = random_model(seed=27)
    model = BertForMaskedLM(config)
    batch = random_inputs(config, batch=1, seq=5, seed=0)
    with pytest.raises(ValueError, match="split_bert_state_dict") as info:
        bertlib.bert_forward(model.state_dict(), config, batch["input_ids"])
    assert len(str(info.value)) < 300


# --- pruning: HF 4.x's algorithm, transcribed, applied to transformers 5 modules ------------------------------

def _find_pruneable_heads_and_indices(heads, n_heads, head_size, already_pruned_heads):
    """transformers 4.x ``pytorch_utils.find_pruneable_heads_and_indices``, verbatim but for names."""
    mask = torch.ones(n_heads, head_size)
    heads = set(heads) - already_pruned_heads
    for head in heads:
        head = head - sum(1 if h < head else 0 for h in already_pruned_heads)
        mask[head] = 0
    mask = mask.view(-1).contiguous().eq(1)
    index = torch.arange(len(mask))[mask].long()
    return heads, index


def _prune_linear_layer(layer: nn.Linear, index: torch.Tensor, dim: int = 0) -> nn.Linear:
    """transformers 4.x ``prune_linear_layer``."""
    w = layer.weight.index_select(dim, index).detach().clone()
    b = layer.bias.detach().clone() if dim == 1 else layer.bias[index].detach().clone()
    new = nn.Linear(w.shape[1], w.shape[0]).to(w)
    with torch.no_grad():
        new.weight.copy_(w)
        new.bias.copy_(b)
    return new


def _hf4_prune_heads(model, state: dict, heads_to_prune: dict) -> None:
    """transformers 4.x ``PreTrainedModel.prune_heads`` → ``BertModel._prune_heads`` → ``BertAttention.prune_heads``
    (``state``: each layer's ``pruned_heads`` set and head count, which 4.x kept on the modules)."""
    for layer, heads in heads_to_prune.items():
        att = model.encoder.layer[layer].attention  # a Python list index: -1 is the last layer
        key = layer % len(model.encoder.layer)
        pruned, n_heads = state.setdefault(key, (set(), model.config.num_attention_heads))
        if len(heads) == 0:
            continue
        d = model.config.hidden_size // model.config.num_attention_heads
        heads, index = _find_pruneable_heads_and_indices(heads, n_heads, d, pruned)
        for n in ("query", "key", "value"):
            setattr(att.self, n, _prune_linear_layer(getattr(att.self, n), index))
        att.output.dense = _prune_linear_layer(att.output.dense, index, dim=1)
        state[key] = (pruned | heads, n_heads - len(heads))


def test_prune_matches_transformers_4_algorithm():
    sd, config, model = random_model(seed=28, dtype=torch.float64, num_hidden_layers=3)
    batch = random_inputs(config, batch=2, seq=8, seed=29)
    real = batch["attention_mask"].bool()
    hf, hf_state = copy.deepcopy(model), {}
    ours, ours_config = sd, config
    for step in ({0: [1], -1: [0, 2]}, {0: [3, 1], 1: [0, 0]}, {-1: [2, 3], 0: [0, 2]}):  # repeats, re-prunes
        _hf4_prune_heads(hf, hf_state, step)
        ours, ours_config = HP.prune(ours, ours_config, step)
        hf_sd = hf.state_dict()
        for k, v in ours.items():
            assert torch.equal(v, hf_sd[k]), k
        assert {k: sorted(v[0]) for k, v in hf_state.items() if v[0]} == ours_config.pruned_heads
        with torch.no_grad():
            ref = hf(**batch).last_hidden_state
        for impl in IMPLS:
            out = bertlib.bert_forward(ours, ours_config, **batch, attn_implementation=impl).last_hidden_state
            assert_close(out[real], ref[real], **F64)
    assert ours_config.pruned_heads == {0: [0, 1, 2, 3], 1: [0], 2: [0, 2, 3]}
    assert HP.heads_per_layer(ours, config) == [0, 3, 1]


def test_pruned_checkpoint_loads_with_config_pruned_heads(tmp_path, pretrained, real_batch):
    """A pruned checkpoint (config.json with pruned_heads, smaller weights, keys of a BertFor... model) loads,
    runs, and equals masking those heads in the unpruned model; to_hf_model gives the matching BertModel."""
    sd, config = pretrained.state_dict, pretrained.config
    heads = {0: [0, 5], -1: [3]}
    pruned, pruned_config = HP.prune(sd, config, heads)
    pruned_config.save_pretrained(tmp_path)
    pretrained.tokenizer.save_pretrained(tmp_path)
    save_file({"bert." + k: v.contiguous().cpu() for k, v in pruned.items()}, str(tmp_path / "model.safetensors"))
    loaded = bertlib.load_pretrained(tmp_path, device=sd["embeddings.word_embeddings.weight"].device)
    assert {int(k): v for k, v in loaded.config.pruned_heads.items()} == {0: [0, 5], config.num_hidden_layers - 1: [3]}
    out = bertlib.bert_forward(loaded.state_dict, loaded.config, **real_batch)
    masked = bertlib.bert_forward(sd, config, **real_batch, head_mask=HP.head_mask_for(
        config, heads, device=out.last_hidden_state.device))
    real = real_batch["attention_mask"].bool()
    assert_close(out.last_hidden_state[real], masked.last_hidden_state[real], **F32)
    assert out.attentions[0].shape[1] == config.num_attention_heads - 2
    with torch.no_grad():
        ref = bertlib.to_hf_model(loaded)(**real_batch)
    assert_close(out.last_hidden_state[real], ref.last_hidden_state[real], **F32)
    # head_mask keeps the original numbering on a pruned model: the pruned heads' factors are dropped
    hm = torch.ones(config.num_hidden_layers, config.num_attention_heads, device=out.last_hidden_state.device)
    hm[0, 1] = 0.0
    both = bertlib.bert_forward(loaded.state_dict, loaded.config, **real_batch, head_mask=hm)
    assert (both.attentions[0][:, 0] == 0).all()  # head 1 is the first one left in layer 0
    assert (both.attentions[0][:, 1:] != 0).any()


def test_cross_attention_is_refused():
    sd, config, _ = random_model(seed=30)
    dec = BertConfig(**{**config.to_dict(), "is_decoder": True, "add_cross_attention": True})
    with pytest.raises(ValueError, match="add_cross_attention"):
        bertlib.bert_forward(sd, dec, random_inputs(config, 1, 4, 0)["input_ids"])


def test_check_false_gives_the_same_numbers(pretrained, real_batch):
    """check=False skips the validation only; the computation is the same."""
    a = bertlib.bert_forward(pretrained.state_dict, pretrained.config, **real_batch)
    b = bertlib.bert_forward(pretrained.state_dict, pretrained.config, **real_batch, check=False)
    assert torch.equal(a.last_hidden_state, b.last_hidden_state) and torch.equal(a.pooler_output, b.pooler_output)


def test_one_layer_loop():
    """The package runs its layers in one place (bertlib.model.encoder.encoder); every other module reaches them
    through it (numpy_bert, chapter 12's NumPy port, is the exception by design)."""
    import ast
    from pathlib import Path

    root = Path(bertlib.__file__).parent
    steps = {"encoder_layer", "self_attention", "attention_output", "feed_forward", "attention_head"}
    loops = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.For):
                iters = [node.iter]
            elif isinstance(node, ast.ListComp | ast.GeneratorExp | ast.SetComp | ast.DictComp):
                iters = [g.iter for g in node.generators]
            else:
                continue
            if any("num_hidden_layers" in ast.unparse(i) for i in iters) and any(
                    f"{step}(" in ast.unparse(node) for step in steps):
                loops.append(path.name)
    assert [name for name in loops if name != "numpy_bert.py"] == ["encoder.py"], loops
