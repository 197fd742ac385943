"""The glass box of an encoder-only classifier: the probabilities are `Classifier`'s, the head's
numbers are recomputed from the trace, gradient x input saliency is a finite difference, the
rollout a NumPy product of the traced maps, and the CLI (`aiayn explain --text`, `aiayn attend`)
says bad input in one line."""

import copy
import json
import math

import numpy as np
import pytest
import torch

from aiayn.classify.classifier import Classifier
from aiayn.cli.main import main
from aiayn.config import ModelConfig
from aiayn.errors import AiaynError
from aiayn.glassbox.explain_cls import explain_classifier
from aiayn.glassbox.render import View
from aiayn.glassbox.render_cls import cls_to_json, cls_to_text
from aiayn.nn.encoder_only import EncoderClassifier
from aiayn.nn.variants import DecoderLM
from aiayn.runtime.device import choose_precision
from aiayn.store.model_dir import save_model_dir
from aiayn.text.charset import CharTokenizer

TEXT = "a gripping film with a dull plot, the best and the worst of it"
SENTENCE = "a dull film"
LABELS = ["neg", "neu", "pos"]
# (pooling, pooler, embed_norm): the paper's stack with mean pooling, and BERT's head
VARIANTS = {"mean": ("mean", False, False), "cls": ("cls", True, True)}


def make_classifier(variant: str, dtype: torch.dtype = torch.float32) -> Classifier:
    pooling, pooler, embed_norm = VARIANTS[variant]
    tok = CharTokenizer.fit([TEXT])
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                      dropout=0.0, max_len=24, pooling=pooling, pooler=pooler,
                      embed_norm=embed_norm)  # fmt: skip
    torch.manual_seed(0)
    model = EncoderClassifier(cfg, len(LABELS), LABELS).to(dtype)
    return Classifier(model, tok, choose_precision("fp32", torch.device("cpu"), decoding=True))


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def classifier(request):
    return make_classifier(request.param)


@pytest.fixture(scope="module")
def exp(classifier):
    return explain_classifier(classifier, SENTENCE)


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


def test_probabilities_are_the_classifiers(classifier, exp):
    probs = classifier.probabilities([SENTENCE])[0]
    torch.testing.assert_close(exp.probs, probs, atol=1e-6, rtol=0)
    torch.testing.assert_close(exp.logits, classifier.logits([SENTENCE])[0], atol=1e-5, rtol=0)
    assert exp.ids == classifier.ids([SENTENCE])[0] and exp.pieces[0] == "<s>"
    assert exp.predicted == int(exp.probs.argmax()) and exp.saliency.target == exp.predicted
    assert float(exp.probs.sum()) == pytest.approx(1.0)


def test_the_head_is_recomputed_from_the_trace(classifier, exp):
    model = classifier.model
    L, H = model.cfg.n_layers, model.cfg.n_heads
    last = exp.forward[f"encoder.{L - 1}.norm2"]  # the stack's output (post-LN)
    pooled = last[0] if model.cfg.pooling == "cls" else last.mean(0)
    torch.testing.assert_close(exp.pooled, pooled)
    read = exp.pooled
    if model.cfg.pooler:
        assert "encoder.embed.norm" in exp.forward.entries
        read = torch.tanh(model.pooler.weight.detach() @ exp.pooled + model.pooler.bias.detach())
        torch.testing.assert_close(exp.pooler, read)
    else:
        assert exp.pooler is None and "pooler" not in exp.forward.entries
    logits = model.classifier.weight.detach() @ read + model.classifier.bias.detach()
    torch.testing.assert_close(exp.logits, logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(exp.forward["classifier.probs"], exp.probs)
    # every layer and head is traced, each weight row a softmax of its scaled scores
    for layer in range(L):
        for h in range(1, H + 1):
            name = f"encoder.{layer}.self_attn.head{h}"
            q, k = _np(exp.forward[f"{name}.q"]), _np(exp.forward[f"{name}.k"])
            s = q @ k.T / math.sqrt(model.cfg.d_k)
            w = np.exp(s - s.max(1, keepdims=True))
            np.testing.assert_allclose(_np(exp.forward[f"{name}.weights"]),
                                       w / w.sum(1, keepdims=True), atol=1e-5)  # fmt: skip
    assert {f"encoder.{layer}.ffn.hidden" for layer in range(L)} <= set(exp.forward.entries)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_saliency_is_a_finite_difference(variant):
    """values[t] = d logit_c / d alpha at alpha = 1, where token t's embedding is alpha e_t: a
    central difference of the model itself (float64), for the predicted class and another."""
    classifier = make_classifier(variant, torch.float64)
    model = classifier.model
    ids = torch.tensor(classifier.ids([SENTENCE]))
    for label in (None, "pos"):
        exp = explain_classifier(classifier, SENTENCE, class_label=label)
        c = exp.saliency.target
        assert label is None or exp.saliency.label == label == LABELS[c]

        def logit(t: int, alpha: float, c=c) -> float:
            def scale(_m, _i, out):
                out = out.clone()
                out[0, t] *= alpha
                return out

            hook = model.embed.tokens.register_forward_hook(scale)
            try:
                with torch.no_grad():
                    return float(model(ids)[0, c])
            finally:
                hook.remove()

        eps = 1e-5
        fd = [(logit(t, 1 + eps) - logit(t, 1 - eps)) / (2 * eps) for t in range(ids.size(1))]
        np.testing.assert_allclose(exp.saliency.values, fd, atol=1e-7, rtol=1e-5)
        top = max(abs(v) for v in fd)
        np.testing.assert_allclose(exp.saliency.normalised, np.array(fd) / top, atol=1e-6)
        assert max(abs(v) for v in exp.saliency.normalised) == pytest.approx(1.0)
    assert all(p.grad is None for p in model.parameters())  # no gradient left on the weights


def test_rollout_is_a_numpy_product_of_the_traced_maps(classifier, exp):
    cfg = classifier.model.cfg
    T = len(exp.ids)
    r = np.eye(T)
    for layer in range(cfg.n_layers):
        heads = [_np(exp.forward[f"encoder.{layer}.self_attn.head{h}.weights"])
                 for h in range(1, cfg.n_heads + 1)]  # fmt: skip
        a = 0.5 * np.mean(heads, axis=0) + 0.5 * np.eye(T)
        a /= a.sum(1, keepdims=True)
        r = a @ r
    np.testing.assert_allclose(_np(exp.rollout_matrix), r, atol=1e-12)
    np.testing.assert_allclose(r.sum(1), np.ones(T), atol=1e-12)  # each row sums to 1
    want = r[0] if cfg.pooling == "cls" else r.mean(0)
    np.testing.assert_allclose(_np(exp.rollout), want, atol=1e-12)
    assert float(exp.rollout.sum()) == pytest.approx(1.0) and bool((exp.rollout > 0).all())


def test_a_class_asked_for_and_a_text_past_the_positions(classifier, caplog):
    with pytest.raises(AiaynError, match="no class 'maybe': the model's classes are 'neg', 'neu'"):
        explain_classifier(classifier, SENTENCE, class_label="maybe")
    with pytest.raises(AiaynError, match="needs a Classifier"):
        explain_classifier(classifier.model, SENTENCE)
    long = explain_classifier(classifier, TEXT)  # 62 characters, 24 positions
    assert long.cut and len(long.ids) == 24 and long.pieces[-1] == "</s>"
    assert "explaining its first 22" in caplog.text
    empty = explain_classifier(classifier, "")  # BOS and EOS alone: still a decision
    assert empty.pieces == ["<s>", "</s>"] and float(empty.rollout.sum()) == pytest.approx(1.0)


def test_text_and_json(exp):
    text = cls_to_text(exp, View(layers=(1,), heads=(2,), dims=4))
    assert "encoder.1.self_attn.head2.weights" in text and "encoder.0." not in text
    assert "self_attn.head1." not in text and "\x1b[" not in text
    assert "It IS NOT causal proof" in text and "ignores the FFNs" in text
    assert "<- predicted" in text and "softmax(logits): the class probabilities" in text
    assert "next-token" not in text  # the classifier's own descriptions, not a decoder's
    assert "|" in text and "█" in text  # the bars
    coloured = cls_to_text(exp, ansi=True)
    assert "\x1b[" in coloured and "48;2;" in coloured
    data = json.loads(json.dumps(cls_to_json(exp, View(layers=(0,))), allow_nan=False))
    assert data["format"] == "aiayn.explain_cls/1" and data["labels"] == LABELS
    assert data["probabilities"] == pytest.approx(exp.probs.tolist(), abs=1e-7)
    assert len(data["saliency"]["values"]) == len(data["input"]["pieces"]) == len(exp.ids)
    assert data["rollout"]["per_token"] == pytest.approx(exp.rollout.tolist(), abs=1e-7)
    names = {t["name"] for t in data["tensors"]}
    assert "encoder.0.ffn.hidden" in names and "encoder.1.ffn.hidden" not in names
    assert {"pooled", "classifier.logits", "classifier.probs"} <= names


# --- the command line -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cls_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cls")
    c = make_classifier("cls")
    save_model_dir(c.model, out)
    c.tok.save(out)
    return out


def test_cli_explain_a_classifier(cls_dir, capsys):
    argv = ["explain", "--model", str(cls_dir), "--text", SENTENCE]
    assert main([*argv, "--json", "--class", "pos"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "classify" and data["saliency"]["class"] == "pos"
    opened = Classifier.open(cls_dir, "cpu", "fp32")
    assert data["probabilities"] == pytest.approx(opened.probabilities([SENTENCE])[0].tolist(),
                                                  abs=1e-6)  # fmt: skip
    assert main([*argv, "--layers", "0", "--dims", "3"]) == 0
    text = capsys.readouterr().out
    assert "== attention rollout per token ==" in text and "encoder.1." not in text
    assert "\x1b[" not in text  # not a terminal: no colour
    assert main(["explain", "--model", str(cls_dir), SENTENCE, "--json"]) == 0  # positional
    assert json.loads(capsys.readouterr().out)["input"]["text"] == SENTENCE


@pytest.mark.parametrize("flags,message", [
    (["--text", SENTENCE, "--class", "maybe"], "no class 'maybe'"),
    (["--text", SENTENCE, "--html", "x.html"], "prints as text or json"),
    (["--text", SENTENCE, "--prompt", "a"], "--prompt is for a language model"),
    (["--text", SENTENCE, "again"], "give the text once"),
    ([], "a classifier explains a text: give --text TEXT"),
    (["--text", SENTENCE, "--layers", "5"], "layer 5 does not exist"),
    (["--text", SENTENCE, "--max-trace-numbers", "100"], "more than 100 numbers"),
    (["--text", SENTENCE, "--steps", "0", "--top-k", "3"], "--steps, --top-k set a search's"),
])  # fmt: skip
def test_cli_bad_input_is_one_line(cls_dir, capsys, flags, message):
    assert main(["explain", "--model", str(cls_dir), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_cli_text_is_for_a_classifier(tmp_path, capsys):
    tok = CharTokenizer.fit([TEXT])
    save_model_dir(DecoderLM(ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2,
                                         n_layers=1, d_ff=32, max_len=16)), tmp_path)  # fmt: skip
    tok.save(tmp_path)
    assert main(["explain", "--model", str(tmp_path), "--text", "a"]) == 2
    assert "--text and --class are for a classifier" in capsys.readouterr().err


def test_cli_attend_on_a_classifier(cls_dir, tmp_path):
    """`aiayn attend` draws a classifier's self-attention over the input it classifies: BOS +
    the text + EOS (BOS is the position cls pooling reads)."""
    out = tmp_path / "att"
    assert main(["attend", "--model", str(cls_dir), SENTENCE, "--out", str(out)]) == 0
    assert (out / "enc_self.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "attention.html").read_text(encoding="utf-8")
    blob = page.split('<script type="application/json" id="data">')[1].split("</script>")[0]
    (example,) = json.loads(blob.replace("<\\/", "</"))["examples"]
    drawn_map = example["kinds"]["enc_self"]
    assert drawn_map["rows"] == drawn_map["cols"] == ["<s>", *SENTENCE, "</s>"]
    exp = explain_classifier(Classifier.open(cls_dir, "cpu", "fp32"), SENTENCE)
    drawn = torch.tensor(drawn_map["w"])
    torch.testing.assert_close(drawn, torch.stack(exp.attention()), atol=1e-4, rtol=0)


def test_a_copy_of_the_model_is_unchanged(classifier):
    """Explaining leaves the model as it was: no hook, no gradient, eval mode."""
    before = copy.deepcopy(classifier.model.state_dict())
    explain_classifier(classifier, SENTENCE)
    assert not classifier.model.embed.tokens._forward_hooks and not classifier.model.training
    for k, v in classifier.model.state_dict().items():
        assert torch.equal(v, before[k])


def test_the_callers_grad_mode_does_not_matter(classifier, exp):
    """A server's worker may call it under inference_mode or no_grad: the saliency is the same."""
    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            again = explain_classifier(classifier, SENTENCE)
        assert again.saliency.values == pytest.approx(exp.saliency.values, abs=1e-6)


def test_a_notebook_draws_it(exp):
    page = exp._repr_html_()
    assert "<script" not in page and "gradient x input" in page and "rollout" in page
    assert page.count("<span title=") == 2 * len(exp.pieces)  # saliency and rollout, per token
    assert "IS NOT" in page and f"{float(exp.probs[exp.predicted]):.4f}" in page


def test_a_pre_ln_model_shows_its_final_norm():
    tok = CharTokenizer.fit([TEXT])
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                      dropout=0.0, max_len=24, norm_first=True)  # fmt: skip
    model = EncoderClassifier(cfg, 2, ["a", "b"])
    c = Classifier(model, tok, choose_precision("fp32", torch.device("cpu"), decoding=True))
    exp = explain_classifier(c, SENTENCE)
    torch.testing.assert_close(exp.pooled, exp.forward["encoder.norm"].mean(0))
    assert "\nencoder.norm  [" in cls_to_text(exp)
