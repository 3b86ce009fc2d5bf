"""bertlib.perf.engines on a tiny random BERT (issue 29): every engine computes bertlib's logits.

Each engine is compared with :func:`bertlib.perf.engines.make_bertlib` (sdpa) on a padded batch: float32 engines within
1e-4 (different kernels sum in different orders), int8 weights within 5 % of the logits' spread (8-bit weights and
activations). An engine whose package is absent is skipped with the reason. The ONNX export (ONNX Runtime, OpenVINO)
and ``torch.compile`` are marked slow: the export takes 10-30 s and the first compiled call a minute or more on 2
shared cores.
"""

import pytest
import torch

from bertlib.perf import engines as E
from bertlib.tasks.classifier import BertClassifier
from bertlib.variants import fast_linear
from helpers import needs_data

FP32 = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def tiny_classifier(tiny_pretrained):
    torch.manual_seed(0)
    model = BertClassifier(tiny_pretrained.state_dict, tiny_pretrained.config, 5, attn_implementation="sdpa",
                           fused=True).eval()
    with torch.no_grad():  # a head that separates the classes (the seeded init is tiny)
        model.classifier.weight.normal_(0, 1.0)
    return model


@pytest.fixture(scope="module")
def batch(tiny_classifier):
    g = torch.Generator().manual_seed(0)
    vocab = tiny_classifier.config.vocab_size
    ids = torch.randint(1000, vocab, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    mask[2, 7:] = 0
    ids[mask == 0] = 0  # the pad id
    return ids, mask


@pytest.fixture(scope="module")
def reference(tiny_classifier, batch):
    with torch.inference_mode():
        out = E.make_bertlib(tiny_classifier)(*batch)
        assert torch.equal(out, tiny_classifier(*batch)), "make_bertlib is BertClassifier's forward pass"
        return out


@pytest.fixture(scope="module")
def onnx_file(tiny_classifier, tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    try:
        E.export_onnx(tiny_classifier, path)
    except E.EngineUnavailable as e:
        pytest.skip(str(e))
    return path


def _run(engine, batch):
    with torch.inference_mode():
        return engine(*batch)


def test_padding_free(tiny_classifier, batch, reference):
    torch.testing.assert_close(_run(E.make_bertlib(tiny_classifier, "unpadded"), batch), reference, **FP32)


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this PyTorch")


@needs_onednn
@pytest.mark.parametrize("attn", ["sdpa", "unpadded"])
def test_prepacked_weights(tiny_classifier, batch, reference, attn):
    engine = E.make_packed(tiny_classifier, attn)
    torch.testing.assert_close(_run(engine, batch), reference, **FP32)
    config = tiny_classifier.config
    sd = fast_linear.pack_weights({k: v.detach() for k, v in tiny_classifier.bert.named_parameters()}, config)
    packed = {k: v for k, v in sd.items() if isinstance(v, fast_linear.PackedLinear)}
    assert len(packed) == 6 * config.num_hidden_layers + 1  # Q, K, V, output, FFN in/out; the pooler
    assert all(p.packed.is_mkldnn for p in packed.values())  # the weights really were reordered for oneDNN
    fused = {k for k, v in packed.items() if v.activation == config.hidden_act}
    assert fused == {f"encoder.layer.{i}.intermediate.dense.weight" for i in range(config.num_hidden_layers)}


@needs_onednn
@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_prepacked_weight_applies_its_activation(act):
    from bertlib.model.layer import activation

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 7, 16, generator=g), torch.randn(24, 16, generator=g), torch.randn(24, generator=g)
    torch.testing.assert_close(torch.nn.functional.linear(x, fast_linear.PackedLinear(w, act), b),
                               activation(act)(torch.nn.functional.linear(x, w, b)), **FP32)
    torch.testing.assert_close(torch.nn.functional.linear(input=x, weight=fast_linear.PackedLinear(w), bias=b),
                               torch.nn.functional.linear(x, w, b), **FP32)  # keywords too
    with pytest.raises(ValueError, match="inside the product, not 'swish'"):
        fast_linear.PackedLinear(w, "swish")
    with pytest.raises(TypeError, match="float32 inputs"):
        torch.nn.functional.linear(x.bfloat16(), fast_linear.PackedLinear(w), b)


@needs_onednn
def test_feed_forward_with_prepacked_weights_applies_the_activation_once(tiny_classifier):
    """An activation oneDNN is not asked to fuse (silu) stays in feed_forward; a weight packed for another
    activation than the config's is refused, not applied twice."""
    from bertlib.model.layer import feed_forward

    config = tiny_classifier.config
    sd = {k: v.detach() for k, v in tiny_classifier.bert.named_parameters()}
    x = torch.randn(2, 5, config.hidden_size, generator=torch.Generator().manual_seed(0))
    silu = type(config)(**{**config.to_dict(), "hidden_act": "silu"})
    packed = fast_linear.pack_weights(sd, silu)
    assert packed["encoder.layer.0.intermediate.dense.weight"].activation is None
    torch.testing.assert_close(feed_forward(packed, silu, x), feed_forward(sd, silu, x), **FP32)
    with pytest.raises(ValueError, match="applies 'gelu' but config.hidden_act is 'silu'"):
        feed_forward(fast_linear.pack_weights(sd, config), silu, x)


@pytest.mark.parametrize("attn", ["sdpa", "unpadded"])
def test_int8_weights(tiny_classifier, batch, reference, attn):
    out = _run(E.make_int8(tiny_classifier, attn), batch)
    spread = (reference.max() - reference.min()).item()
    assert (out - reference).abs().max().item() < 0.05 * spread
    assert not torch.equal(out, reference)  # the weights really were int8


needs_bf16 = pytest.mark.skipif(not E.bf16_supported("cpu"), reason="no native bfloat16 matrix products on this CPU")


@needs_bf16
def test_bf16_autocast(tiny_classifier, batch, reference):
    """bfloat16 autocast (8 bits of mantissa): float32 logits close to the reference, not equal to it."""
    out = _run(E.make_bf16(tiny_classifier), batch)
    spread = (reference.max() - reference.min()).item()
    assert out.dtype == torch.float32 and (out - reference).abs().max().item() < 0.05 * spread
    assert not torch.equal(out, reference)  # the products really ran in bfloat16


def test_bf16_row_is_skipped_without_bf16(tiny_classifier, monkeypatch):
    monkeypatch.setattr(E, "bf16_supported", lambda device="cpu": False)
    with pytest.raises(E.EngineUnavailable, match="bfloat16"):
        E.make_bf16(tiny_classifier)


def test_int8_weight_is_int8(tiny_classifier):
    sd = fast_linear.quantize_weights({k: v.detach() for k, v in tiny_classifier.bert.named_parameters()})
    q = [v for v in sd.values() if isinstance(v, fast_linear.Int8Linear)]
    assert len(q) == 6 * tiny_classifier.config.num_hidden_layers + 1  # Q, K, V, output, FFN in/out; the pooler
    with pytest.raises(TypeError):
        torch.matmul(torch.ones(2, 2), q[0])  # only F.linear is supported


@pytest.mark.slow  # the ONNX export takes 10-30 s on 2 shared cores
def test_onnx_runtime(tiny_classifier, batch, reference, onnx_file):
    pytest.importorskip("onnxruntime")
    for optimize in (False, True):
        torch.testing.assert_close(_run(E.make_ort(tiny_classifier, onnx_file, optimize), batch), reference, **FP32)


@pytest.mark.slow  # the ONNX export of Hugging Face's graph (optimum's route, without optimum)
def test_onnx_runtime_on_hf_graph(tiny_classifier, batch, reference, tmp_path):
    pytest.importorskip("onnxruntime")
    from bertlib.tasks.export import to_hf_classifier

    hf = to_hf_classifier(tiny_classifier, [str(i) for i in range(5)]).eval()
    hf.set_attn_implementation("sdpa")
    path = tmp_path / "hf.onnx"
    E.export_onnx(tiny_classifier, path, hf_model=hf)
    for optimize in (False, True):
        torch.testing.assert_close(_run(E.make_ort(tiny_classifier, path, optimize), batch), reference, **FP32)


@pytest.mark.slow  # the ONNX export, then ORT's quantization
def test_onnx_runtime_int8(tiny_classifier, batch, reference, onnx_file):
    pytest.importorskip("onnxruntime")
    out = _run(E.make_ort(tiny_classifier, onnx_file, True, int8=True), batch)
    assert (out - reference).abs().max().item() < 0.05 * (reference.max() - reference.min()).item()
    assert not torch.equal(out, reference)


@pytest.mark.slow  # the ONNX export, then OpenVINO's compilation
def test_openvino(tiny_classifier, batch, reference, onnx_file):
    pytest.importorskip("openvino", reason="openvino is not installed (pip install -e '.[bench]')")
    torch.testing.assert_close(_run(E.make_openvino(tiny_classifier, onnx_file), batch), reference, **FP32)


def test_ctranslate2(tiny_classifier, tiny_pretrained, batch, reference, tmp_path):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install -e '.[bench]')")
    out = _run(E.make_ctranslate2(tiny_classifier, tiny_pretrained.tokenizer, tmp_path), batch)
    torch.testing.assert_close(out, reference, **FP32)


def test_ctranslate2_keeps_each_models_conversion_apart(tiny_classifier, tiny_pretrained, batch, reference, tmp_path):
    """A converted model is cached in the work directory; another classifier's conversion must not be reused."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install -e '.[bench]')")
    import copy

    other = copy.deepcopy(tiny_classifier)
    with torch.no_grad():
        other.bert.get_parameter("pooler.dense.weight").mul_(-1.0)
    E.make_ctranslate2(other, tiny_pretrained.tokenizer, tmp_path)  # converted first, into the same directory
    out = _run(E.make_ctranslate2(tiny_classifier, tiny_pretrained.tokenizer, tmp_path), batch)
    torch.testing.assert_close(out, reference, **FP32)


def test_ctranslate2_int8(tiny_classifier, tiny_pretrained, batch, reference, tmp_path):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install -e '.[bench]')")
    out = _run(E.make_ctranslate2(tiny_classifier, tiny_pretrained.tokenizer, tmp_path, "int8"), batch)
    assert (out - reference).abs().max().item() < 0.05 * (reference.max() - reference.min()).item()


def test_missing_package_is_a_clear_skip():
    with pytest.raises(E.EngineUnavailable, match=r"pip install -e '\.\[bench\]'"):
        E.require("no_such_engine_package")


@pytest.mark.slow
def test_torch_compile(tiny_classifier, batch, reference):
    engine = E.make_compiled(tiny_classifier, "sdpa", batch)
    torch.testing.assert_close(_run(engine, batch), reference, **FP32)
    ids, mask = batch
    torch.testing.assert_close(_run(engine, (ids[:2, :20], mask[:2, :20])),
                               _run(E.make_bertlib(tiny_classifier), (ids[:2, :20], mask[:2, :20])), **FP32)


@needs_data
def test_engine_rows_time_every_method_and_score_it(tiny_pretrained, tmp_path):
    """bench.engine_rows end to end on a tiny model and 8 posts: one row per method, speeds and speed-ups positive,
    the fp32 reference row at 0 points from itself, the int8 row present, the setup as asked."""
    from bertlib.data.corpus import load_20newsgroups
    from bertlib.perf.bench_engines import EngineSettings, engine_rows

    names = list(load_20newsgroups("test").target_names)
    model = BertClassifier(tiny_pretrained.state_dict, tiny_pretrained.config, len(names), attn_implementation="sdpa",
                           fused=True).eval()
    settings = EngineSettings(n_posts=8, max_length=32, batch_size=4, rounds=2,
                              engines=["bertlib padding-free int8, length-sorted",
                                       "bertlib padding-free, prepacked weights, length-sorted"],
                              workdir=tmp_path, latency_repeats=1, core=False, accuracy_posts=16)
    run = engine_rows(model, tiny_pretrained.tokenizer, names, torch.device("cpu"), settings)
    rows = {r["method"]: r for r in run["rows"]}
    assert set(rows) == {"hf-sdpa, naive batches", "bertlib padding-free, length-sorted",
                         "bertlib padding-free int8, length-sorted",
                         "bertlib padding-free, prepacked weights, length-sorted"}
    assert rows["bertlib padding-free, prepacked weights, length-sorted"]["max_abs_logit_diff"] < 1e-3
    assert run["setup"]["posts"] == 8 and run["setup"]["max_length"] == 32 and run["skipped"] == {}
    ref = rows["bertlib padding-free, length-sorted"]
    assert ref["delta_points"] == 0 and ref["counts"] and ref["agree_with_fp32"] == 1.0
    assert rows["hf-sdpa, naive batches"]["max_abs_logit_diff"] < 1e-3  # HF's classifier: the same logits
    for r in rows.values():  # scored again on 16 posts only if a prediction changed on the 8 timed ones
        assert r["accuracy_posts"] == 16 or (r["accuracy_posts"] == 8 and r["agree_with_fp32"] == 1.0)
        assert r["posts"] == 8 and r["rounds"] == 2 and r["posts_per_s"] > 0 and r["latency_ms_128"] > 0
        assert r["speedup_min"] <= r["speedup_vs_hf_naive"] <= r["speedup_max"]


def test_rows_that_changed_predictions_are_scored_again_on_more_posts(tiny_pretrained):
    """engine_rows' accuracy pass (accuracy_posts): the reference and each row that changed a prediction on the
    timed posts classify the larger set; those rows' accuracy fields come from it, the other rows keep theirs."""
    from bertlib.perf.bench_engines import _score_again

    ref_name, n_labels = "bertlib padding-free, length-sorted", 4

    def ref_fn(ids, mask):  # a deterministic "classifier": the class is the number of real tokens mod 4
        return torch.nn.functional.one_hot(mask.sum(1) % n_labels, n_labels).float()

    def flip_fn(ids, mask):  # the same, but class 0 becomes class 1
        logits = ref_fn(ids, mask)
        return torch.where((logits.argmax(-1) == 0)[:, None], logits.roll(1, dims=1), logits)

    texts = [" ".join(["word"] * n) for n in range(1, 25)]
    ref_pred = torch.tensor([(n + 2) % n_labels for n in range(1, 25)])  # [CLS] and [SEP] count too
    labels = torch.where(torch.arange(24) % 2 == 0, ref_pred, (ref_pred + 1) % n_labels)  # fp32 right on half
    methods = {ref_name: (None, ref_fn), "flips": (None, flip_fn), "same": (None, ref_fn)}
    rows = [{"method": ref_name, "changed": 0}, {"method": "flips", "changed": 1}, {"method": "same", "changed": 0}]
    ref_acc = _score_again(rows, methods, (texts, labels), n_labels, tiny_pretrained.tokenizer, 32, 5,
                           torch.device("cpu"))
    assert ref_acc == 0.5  # fp32 is right on half the posts, by construction
    assert set(methods) == {ref_name, "flips"}  # the row not scored again was dropped before the long pass
    flips = rows[1]
    flipped = ref_pred == 0
    assert flips["accuracy_posts"] == 24 and flips["changed"] == int(flipped.sum()) > 0
    assert flips["fixed"] == int((flipped & (labels == 1)).sum())
    assert flips["broken"] == int((flipped & (labels == 0)).sum())
    assert flips["delta_points"] == round(100 * (flips["fixed"] - flips["broken"]) / 24, 2)
    assert flips["accuracy"] == round(0.5 + (flips["fixed"] - flips["broken"]) / 24, 4)
    assert flips["counts"] == (abs(flips["delta_points"]) <= 0.3)
    assert "accuracy_posts" not in rows[0] and "accuracy_posts" not in rows[2]  # unchanged rows keep their fields
