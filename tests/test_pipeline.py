"""``bertlib.tasks.pipeline`` (chapter 10) stage by stage against the real
``transformers.pipeline("text-classification")``.

One tiny exported classifier serves every test: the embedded model with a random 4-label head (weights scaled up
so the probabilities are far from uniform and the labels far from ties), written by ``bertlib.tasks.export.export_hf``
and loaded back by the pipeline from the directory. No training and no data set: a few seconds of CPU.
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open
from transformers.pipelines.base import pad_collate_fn
from transformers.pipelines.text_classification import softmax as hf_softmax

import bertlib
import bertlib.tasks.classifier
from bertlib.data import batches
from bertlib.tasks import pipeline as bp
from bertlib.tasks.export import export_hf
from helpers import DEVICE

LABELS = ["alpha", "beta", "gamma", "delta"]
MAX_LENGTH = 16  # short, so the longer texts below are cut and the shorter ones padded
TEXTS = [
    "The pipeline tokenizes the text.",
    "Then it runs the model, and finally it turns the logits into labels with scores that add up to one.",
    "Short.",
    "A batch of texts of different lengths must be padded to the longest one, and the mask says where.",
    "Softmax or sigmoid?",
]
TOL = bertlib.tolerance(DEVICE)


@pytest.fixture(scope="module")
def classifier(pretrained) -> bertlib.tasks.classifier.BertClassifier:
    """A random head that ranks the labels differently for each text, with logits of several units.

    The pooled vectors of different texts share a large common part, so a plain random head would rank the labels
    the same way for every text (and a test of sorting could pass by luck). The head's rows are random mixtures of
    the texts' *centred* pooled vectors instead."""
    model = bertlib.tasks.classifier.BertClassifier(pretrained.state_dict, pretrained.config, len(LABELS), seed=1)
    model = model.to(DEVICE).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        batch = {k: v.to(DEVICE) for k, v in bp.preprocess(pretrained.tokenizer, TEXTS, MAX_LENGTH).items()}
        pooled = bertlib.bert_forward(dict(model.bert.named_parameters()), pretrained.config, **batch).pooler_output
        mean, centred = pooled.mean(0), pooled - pooled.mean(0)                   # (hidden,), (texts, hidden)
        weight = torch.randn(len(LABELS), len(TEXTS), generator=g).to(DEVICE) @ centred  # (labels, hidden)
        weight *= 3.0 / (centred @ weight.T).std()                                 # logits of a few units
        model.classifier.weight.copy_(weight)
        model.classifier.bias.copy_(-weight @ mean + torch.randn(len(LABELS), generator=g).to(DEVICE))
    return model


@pytest.fixture(scope="module")
def exported(classifier, pretrained, tmp_path_factory):
    return export_hf(classifier, pretrained.tokenizer, LABELS, tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def pipe(exported):
    return transformers.pipeline("text-classification", model=str(exported), device=DEVICE)


def _same(ours: list[list[dict]], theirs: list[list[dict]]) -> None:
    """Same labels in the same order, scores within the float32 tolerance."""
    assert [[d["label"] for d in row] for row in ours] == [[d["label"] for d in row] for row in theirs]
    torch.testing.assert_close(torch.tensor([[d["score"] for d in row] for row in ours]),
                               torch.tensor([[d["score"] for d in row] for row in theirs]), **TOL)


# ------------------------------------------------------------------------------------------ numerics


def test_stable_softmax_survives_what_overflows_the_naive_one():
    x = torch.randn(6, 20, generator=torch.Generator().manual_seed(0)) * 100  # exponents far above 88.7
    naive = x.exp() / x.exp().sum(-1, keepdim=True)
    assert torch.isnan(naive).any(), "the naive softmax should overflow here (inf / inf)"
    ours = bp.stable_softmax(x)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, torch.softmax(x, -1), atol=1e-6, rtol=0)
    torch.testing.assert_close(ours, torch.from_numpy(hf_softmax(x.numpy())), atol=1e-6, rtol=0)
    torch.testing.assert_close(ours.sum(-1), torch.ones(6), atol=1e-6, rtol=0)
    # float16: exp overflows above ~11.1
    h = torch.tensor([[12.0, 3.0, -4.0]], dtype=torch.float16)
    assert torch.isnan(h.exp() / h.exp().sum(-1, keepdim=True)).any()
    torch.testing.assert_close(bp.stable_softmax(h).float(), torch.softmax(h.float(), -1), atol=1e-3, rtol=0)
    # far below: the naive one underflows to 0 / 0
    low = torch.tensor([[-1000.0, -1001.0]])
    assert torch.isnan(low.exp() / low.exp().sum(-1, keepdim=True)).all()
    torch.testing.assert_close(bp.stable_softmax(low), torch.softmax(low, -1), atol=1e-6, rtol=0)


def test_softmax_is_shift_invariant_and_sigmoid_is_not():
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(bp.stable_softmax(x + 1000.0), bp.stable_softmax(x), atol=1e-12, rtol=0)
    assert not torch.allclose(bp.sigmoid(x + 1.0), bp.sigmoid(x))
    # two classes: softmax of (a, b) is the sigmoid of a - b
    torch.testing.assert_close(bp.stable_softmax(x[:, :2])[:, 0], bp.sigmoid(x[:, 0] - x[:, 1]), atol=1e-12, rtol=0)


def test_default_function_follows_the_pipelines_rule():
    def cfg(n, problem=None):  # what the rule reads
        return SimpleNamespace(num_labels=n, problem_type=problem)

    assert bp.default_function(cfg(1)) == "sigmoid"
    assert bp.default_function(cfg(4)) == "softmax"
    assert bp.default_function(cfg(4, "single_label_classification")) == "softmax"
    assert bp.default_function(cfg(4, "multi_label_classification")) == "sigmoid"
    assert bp.default_function(cfg(1, "regression")) == "none"
    assert bp.default_function(cfg(1, "single_label_classification")) == "sigmoid"  # one label wins
    assert bp.default_function(transformers.BertConfig(num_labels=3)) == "softmax"  # a real config, no problem_type


# ----------------------------------------------------------------------------- against the pipeline


def test_preprocess_is_the_pipelines_padded_batch(pipe, pretrained):
    ours = bp.preprocess(pretrained.tokenizer, TEXTS, MAX_LENGTH)
    items = [pipe.preprocess(t, truncation=True, max_length=MAX_LENGTH) for t in TEXTS]
    theirs = pad_collate_fn(pipe.tokenizer, None)(items)
    assert set(ours) == set(theirs) == {"input_ids", "token_type_ids", "attention_mask"}
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], atol=0, rtol=0)
    lengths = ours["attention_mask"].sum(1)
    assert lengths.max() == MAX_LENGTH and lengths.min() < MAX_LENGTH, "some rows cut, some padded"
    assert (ours["input_ids"][ours["attention_mask"] == 0] == pretrained.tokenizer.pad_token_id).all()
    # one text alone: no padding at all, exactly pipe.preprocess
    alone = bp.preprocess(pretrained.tokenizer, TEXTS[2], MAX_LENGTH)
    torch.testing.assert_close(alone["input_ids"], items[2]["input_ids"], atol=0, rtol=0)


def test_pad_batch_left_matches_the_collate_function(pretrained):
    tok = copy.deepcopy(pretrained.tokenizer)
    tok.padding_side = "left"
    items = [tok(t, return_tensors="pt") for t in TEXTS[:3]]
    theirs = pad_collate_fn(tok, None)(items)
    ours = batches.pad_batch([{k: v[0].tolist() for k, v in e.items()} for e in items], tok.pad_token_id, "left")
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], atol=0, rtol=0)
    assert ours["attention_mask"][:, -1].all() and not ours["attention_mask"][:, 0].all()


def test_forward_logits_equal_pipeline_and_from_pretrained(pipe, classifier, exported, pretrained):
    batch = bp.preprocess(pretrained.tokenizer, TEXTS, MAX_LENGTH)
    ours = bp.forward(classifier, batch)
    assert ours.shape == (len(TEXTS), len(LABELS)) and ours.device.type == "cpu"
    hf = transformers.BertForSequenceClassification.from_pretrained(exported, attn_implementation="eager")
    torch.testing.assert_close(ours, bp.forward(hf.to(DEVICE), batch), **TOL)
    for i, text in enumerate(TEXTS):  # the pipeline's own _forward, one text at a time, no padding
        theirs = pipe.forward(pipe.preprocess(text, truncation=True, max_length=MAX_LENGTH))["logits"]
        torch.testing.assert_close(ours[i:i + 1], theirs, **TOL)
    assert ours.std() > 1.0, "the test head should give spread-out logits"
    assert len({tuple(r) for r in ours.argsort(-1).tolist()}) >= 3, "and rank the labels differently per text"
    assert (ours.sort(-1).values.diff(dim=-1) > 1e-3).all(), "without near-ties"


@pytest.mark.parametrize("function", bp.FUNCTIONS)
@pytest.mark.parametrize("top_k", [1, 2, None])
def test_classify_equals_pipeline(pipe, classifier, pretrained, function, top_k):
    ours = bp.classify(classifier, pretrained.tokenizer, TEXTS, LABELS, max_length=MAX_LENGTH, batch_size=2,
                       function=function, top_k=top_k)
    theirs = pipe(TEXTS, function_to_apply=function, top_k=top_k, truncation=True, max_length=MAX_LENGTH)
    assert len(ours) == len(TEXTS) and all(len(r) == (top_k or len(LABELS)) for r in ours)
    _same(ours, theirs)
    scores = torch.tensor([[d["score"] for d in r] for r in ours])
    assert (scores[:, :-1] >= scores[:, 1:]).all(), "best first"
    if function == "softmax" and top_k is None:
        torch.testing.assert_close(scores.sum(-1), torch.ones(len(TEXTS)), atol=1e-6, rtol=0)


def test_default_call_is_softmax_top1(pipe, classifier, pretrained):
    theirs = pipe(TEXTS, truncation=True, max_length=MAX_LENGTH)  # no top_k: one dict per text
    ours = bp.classify(classifier, pretrained.tokenizer, TEXTS, LABELS, max_length=MAX_LENGTH)
    _same(ours, [[d] for d in theirs])
    sig = bp.classify(classifier, pretrained.tokenizer, TEXTS, LABELS, max_length=MAX_LENGTH, function="sigmoid")
    assert not torch.allclose(torch.tensor([r[0]["score"] for r in sig]), torch.tensor([d["score"] for d in theirs]))


def test_problem_type_switches_the_pipeline_to_sigmoid(pipe, classifier, pretrained):
    model_outputs = pipe.forward(pipe.preprocess(TEXTS[1], truncation=True, max_length=MAX_LENGTH))
    logits = model_outputs["logits"]
    config = pipe.model.config
    saved = config.problem_type
    try:
        for problem in ("single_label_classification", "multi_label_classification", "regression"):
            config.problem_type = problem
            theirs = pipe.postprocess(model_outputs, top_k=None, _legacy=False)
            _same(bp.postprocess(logits, config.id2label, bp.default_function(config), top_k=None), [theirs])
    finally:
        config.problem_type = saved


def test_one_label_model_gets_a_sigmoid(pretrained, tmp_path):
    """A one-output classifier exported to disk loads in the pipeline (transformers 5 refuses a one-label config
    whose problem_type is single-label classification, so export_hf leaves it unset) and gets a sigmoid."""
    one = bertlib.tasks.classifier.BertClassifier(pretrained.state_dict, pretrained.config, 1, seed=2).to(DEVICE).eval()
    out = export_hf(one, pretrained.tokenizer, ["relevant"], tmp_path / "one")
    assert json.loads((out / "config.json").read_text()).get("problem_type") is None
    pipe1 = transformers.pipeline("text-classification", model=str(out), device=DEVICE)
    theirs = pipe1(TEXTS, truncation=True, max_length=MAX_LENGTH)
    ours = bp.classify(one, pretrained.tokenizer, TEXTS, ["relevant"], max_length=MAX_LENGTH)
    _same(ours, [[d] for d in theirs])
    assert all(0.0 < d["score"] < 1.0 for d in theirs), "a softmax over one label would give 1.0 every time"


def test_batching_changes_nothing(pipe, classifier, pretrained):
    one_by_one = [pipe(t, truncation=True, max_length=MAX_LENGTH)[0] for t in TEXTS]
    for batch_size in (2, 5):
        batched = pipe(TEXTS, batch_size=batch_size, truncation=True, max_length=MAX_LENGTH)
        _same([[d] for d in batched], [[d] for d in one_by_one])
        ours = bp.classify(classifier, pretrained.tokenizer, TEXTS, LABELS, max_length=MAX_LENGTH,
                           batch_size=batch_size, top_k=None)
        _same([r[:1] for r in ours], [[d] for d in one_by_one])


def test_round_trip_files(exported, classifier, pretrained, tmp_path):
    config = json.loads((exported / "config.json").read_text())
    assert config["id2label"] == {str(i): n for i, n in enumerate(LABELS)}
    assert config["architectures"] == ["BertForSequenceClassification"]
    with safe_open(str(exported / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert keys == set(classifier.state_dict())
        for k, v in classifier.state_dict().items():
            torch.testing.assert_close(f.get_tensor(k), v.cpu(), atol=0, rtol=0)
    n_params = sum(p.numel() for p in classifier.parameters())
    header = int(np.frombuffer((exported / "model.safetensors").read_bytes()[:8], dtype="<u8")[0])
    assert (exported / "model.safetensors").stat().st_size == 8 + header + 4 * n_params
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    assert tokenizer.get_vocab() == pretrained.tokenizer.get_vocab()
    assert tokenizer(TEXTS)["input_ids"] == pretrained.tokenizer(TEXTS)["input_ids"]


# ------------------------------------------------------------------------------------------ bad input


def test_bad_input_is_refused(classifier, pretrained):
    logits = torch.zeros(2, len(LABELS))
    with pytest.raises(ValueError, match="function"):
        bp.postprocess(logits, LABELS, function="softmx")
    for k in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="top_k"):
            bp.postprocess(logits, LABELS, top_k=k)
    with pytest.raises(ValueError, match="label names"):
        bp.postprocess(logits, LABELS[:3])
    with pytest.raises(ValueError, match="id2label"):
        bp.postprocess(logits, {0: "a", 1: "b"})
    with pytest.raises(ValueError, match="logits"):
        bp.postprocess(torch.zeros(1, 2, len(LABELS)), LABELS)
    with pytest.raises(ValueError, match="no texts"):
        bp.preprocess(pretrained.tokenizer, [], MAX_LENGTH)
    with pytest.raises(ValueError, match="strings"):
        bp.preprocess(pretrained.tokenizer, ["fine", 3], MAX_LENGTH)
    with pytest.raises(ValueError, match="max_length"):
        bp.preprocess(pretrained.tokenizer, TEXTS, 1)
    with pytest.raises(ValueError, match="batch_size"):
        bp.classify(classifier, pretrained.tokenizer, TEXTS, LABELS, batch_size=0)
    with pytest.raises(ValueError, match="padding_side"):
        batches.pad_batch([{"input_ids": [1, 2]}], 0, "middle")
    with pytest.raises(ValueError, match="same keys"):
        batches.pad_batch([{"input_ids": [1]}, {"input_ids": [1], "attention_mask": [1]}], 0)


def test_postprocess_single_row_and_ties():
    out = bp.postprocess(torch.zeros(len(LABELS)), dict(enumerate(LABELS)), top_k=None)
    assert [d["label"] for d in out[0]] == LABELS, "ties keep the class order"
    torch.testing.assert_close(torch.tensor([d["score"] for d in out[0]]), torch.full((4,), 0.25), atol=1e-7, rtol=0)
    raw = bp.postprocess(torch.tensor([[2.0, -1.0, 3.0, 0.0]]), LABELS, function="none", top_k=2)
    assert raw == [[{"label": "gamma", "score": 3.0}, {"label": "alpha", "score": 2.0}]]
