"""TF-IDF baselines and their ensemble with the fine-tuned model (chapter 9, *beating the baseline*).

The classical baseline reads every word of every post: TF-IDF vectors (sub-linear term frequency, terms seen in at
least two posts) and a linear classifier, logistic regression or a linear SVM (Joachims, 1998). Its errors differ
from a fine-tuned BERT's, which reads windows of WordPiece tokens, so the two combine well: the ensemble averages
their class probabilities, ``p = w * p_bert + (1 - w) * p_tfidf``. A linear SVM gives margins, not probabilities:
``softmax(margins / T)`` with the temperature ``T`` that fits the validation posts best (temperature scaling, Guo
et al., 2017) turns them into some.

Every choice is made on the **validation split**, never on the test set: each baseline's features (words, or words
and character n-grams, :data:`FEATURES`) and regularisation strength ``C`` (:func:`fit_tfidf`), the SVM's
temperature (:func:`fit_temperature`), the ensemble's weight ``w`` (:func:`choose_weight`) and which baseline joins
the ensemble (:func:`ensemble_report`). The test posts are scored once, with the chosen values. The pieces, in
order: :func:`fit_tfidf`, :func:`tfidf_probabilities`, :func:`choose_weight`, :func:`ensemble_report`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bertlib.data.newsgroups import NewsData
from bertlib.evaluation.inference import best_on_validation, scores

#: Regularisation strengths tried for each baseline (the one with the best validation accuracy is kept).
C_GRID: dict[str, tuple[float, ...]] = {"logreg": (3.0, 10.0, 30.0, 100.0), "svc": (0.1, 0.3, 1.0, 3.0)}

#: The TF-IDF features tried for each baseline, chosen on validation with ``C``: the words, or the words and the
#: character 2- to 5-grams inside word boundaries (the 300,000 most frequent), which match spelling variants, parts
#: of e-mail addresses and host names, and numbers. Measured on the ``cpu`` profile's 1,131 validation posts as
#: distributed: LinearSVC 0.928 with words, 0.936 with words and characters.
FEATURES: tuple[str, ...] = ("words", "words+chars")

#: Ensemble weights of the fine-tuned model tried on the validation split (0: TF-IDF alone; 1: BERT alone).
WEIGHT_GRID: tuple[float, ...] = tuple(np.round(np.linspace(0.0, 1.0, 21), 2))


@dataclass
class TfidfModel:
    """A fitted TF-IDF baseline: the vectoriser, the classifier, its kind, and what validation chose: the features,
    ``C``, and for a LinearSVC the temperature of its margins (:func:`fit_temperature`)."""

    vectorizer: object
    classifier: object
    kind: str
    C: float
    val_accuracy: float
    features: str = "words"
    temperature: float | None = None

    def decision(self, texts: list[str]) -> np.ndarray:
        """``(posts, classes)`` scores: log-probabilities (``logreg``) or SVM margins (``svc``)."""
        X = self.vectorizer.transform(texts)
        if self.kind == "logreg":
            return self.classifier.predict_log_proba(X)
        return self.classifier.decision_function(X)

    def predict(self, texts: list[str]) -> np.ndarray:
        return self.decision(texts).argmax(-1)


def _classifier(kind: str, C: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    if kind == "logreg":
        return LogisticRegression(C=C, tol=1e-3, max_iter=1000)
    if kind == "svc":
        return LinearSVC(C=C)
    raise ValueError(f"TF-IDF classifier must be 'logreg' or 'svc', got {kind!r}.")


def tfidf_vectorizer(features: str = "words"):
    """The unfitted vectoriser of :data:`FEATURES` ``features``: word TF-IDF, or word and character-n-gram TF-IDF
    side by side (scikit-learn's ``FeatureUnion``). Defined in chapter 9."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import FeatureUnion

    words = TfidfVectorizer(sublinear_tf=True, min_df=2)
    if features == "words":
        return words
    if features == "words+chars":
        chars = TfidfVectorizer(sublinear_tf=True, min_df=2, analyzer="char_wb", ngram_range=(2, 5),
                                max_features=300_000)
        return FeatureUnion([("words", words), ("chars", chars)])
    raise ValueError(f"TF-IDF features must be one of {FEATURES}, got {features!r}.")


class _Remembered:
    """A fitted vectoriser that keeps the matrix of each list of texts it transformed (the same list object: the
    validation and test posts), so baselines sharing it transform each split once. Character n-grams of 7,532
    posts take about a minute to compute."""

    def __init__(self, vectorizer):
        self.vectorizer, self._seen = vectorizer, []  # [(texts, matrix)], the texts kept so their ids stay theirs

    def __getattr__(self, name: str):  # everything else is the vectoriser's (get_feature_names_out, ...)
        return getattr(self.__dict__["vectorizer"], name)

    def fit_transform(self, texts: list[str]):
        return self.vectorizer.fit_transform(texts)

    def transform(self, texts: list[str]):
        for seen, matrix in self._seen:
            if seen is texts:
                return matrix
        self._seen.append((texts, matrix := self.vectorizer.transform(texts)))
        return matrix


def fit_tfidf(train_texts: list[str], train_labels, val_texts: list[str], val_labels, kind: str = "logreg",
              grid: tuple[float, ...] | None = None, features: tuple[str, ...] = FEATURES, *,
              fitted_features: dict | None = None) -> TfidfModel:
    """For each of ``features`` (:func:`tfidf_vectorizer`, fitted on the training posts) and each ``C`` in ``grid``
    (default :data:`C_GRID`), a ``kind`` classifier (``"logreg"``: logistic regression; ``"svc"``: linear SVM)
    fitted on the training posts; the one with the highest accuracy on the validation posts is kept (on a tie the
    earlier features, then the smaller ``C``). A LinearSVC then gets its temperature (:func:`fit_temperature`). The
    test set plays no part. Calls given the same ``fitted_features`` dict (features → fitted vectoriser and training
    matrix) fit each vectoriser once and transform each list of texts once. Defined in chapter 9."""
    if len(train_texts) != len(train_labels) or len(val_texts) != len(val_labels):
        raise ValueError("texts and labels must have the same length (training and validation posts).")
    grid = grid if grid is not None else C_GRID.get(kind)
    shared = fitted_features if fitted_features is not None else {}
    if grid is None:
        _classifier(kind, 1.0)  # raises the error naming the kinds

    def fitted():  # one vectoriser per feature set, shared by its values of C
        for name in features:
            if name not in shared:
                vec = _Remembered(tfidf_vectorizer(name))
                shared[name] = (vec, vec.fit_transform(train_texts))
            vec, X = shared[name]
            X_val = vec.transform(val_texts)
            for C in grid:
                clf = _classifier(kind, C).fit(X, train_labels)
                acc = float(np.mean(clf.predict(X_val) == np.asarray(val_labels)))
                yield TfidfModel(vec, clf, kind, C, acc, name), acc

    best, _ = best_on_validation(fitted())
    if kind == "svc":
        best.temperature = fit_temperature(best.decision(val_texts), val_labels)
    return best


def fit_temperature(val_margins: np.ndarray, val_labels) -> float:
    """The temperature ``T`` for which ``softmax(margins / T)`` has the least cross-entropy on the validation posts
    (a bounded search over ``log T``; ``T`` in [e^-6, e^3]). ``(val_posts, classes)`` margins, ``(val_posts,)``
    labels. Scaling keeps each post's ranking of the classes: it only sets how sure the probabilities are."""
    from scipy.optimize import minimize_scalar

    margins, y = torch.as_tensor(val_margins, dtype=torch.float64), torch.as_tensor(np.asarray(val_labels))
    if margins.ndim != 2 or len(margins) != len(y):
        raise ValueError(f"margins must be (posts, classes) with one label per post, got {tuple(margins.shape)} "
                         f"and {len(y)} labels.")
    loss = lambda log_t: float(torch.nn.functional.cross_entropy(margins / np.exp(log_t), y))  # noqa: E731
    return float(np.exp(minimize_scalar(loss, bounds=(-6.0, 3.0), method="bounded").x))


def tfidf_probabilities(model: TfidfModel, texts: list[str]) -> np.ndarray:
    """``(posts, classes)`` class probabilities of a baseline (what the ensemble averages): a logistic
    regression's own, or ``softmax(margins / T)`` for a LinearSVC with its fitted temperature."""
    if model.kind == "logreg":
        return np.exp(model.decision(texts))
    if model.temperature is None:
        raise ValueError("this LinearSVC has no temperature: fit it with fit_tfidf, or set model.temperature "
                         "(fit_temperature on validation margins).")
    return softmax(model.decision(texts) / model.temperature)


def softmax(logits: torch.Tensor | np.ndarray) -> np.ndarray:
    """``(posts, classes)`` logits → probabilities (float64 NumPy)."""
    return torch.as_tensor(logits, dtype=torch.float64).softmax(-1).numpy()


def choose_weight(p_bert_val: np.ndarray, p_tfidf_val: np.ndarray, val_labels,
                  grid: tuple[float, ...] = WEIGHT_GRID) -> tuple[float, float]:
    """The weight ``w`` of ``w * p_bert + (1 - w) * p_tfidf`` with the best validation accuracy, and that accuracy.
    Ties go to the weight nearest 0.5 (an even average unless validation says otherwise). Inputs:
    ``(val_posts, classes)`` probabilities, ``(val_posts,)`` labels."""
    if p_bert_val.shape != p_tfidf_val.shape or len(val_labels) != len(p_bert_val):
        raise ValueError(f"probabilities must have the same (posts, classes) shape and one label per post, got "
                         f"{p_bert_val.shape}, {p_tfidf_val.shape} and {len(val_labels)} labels.")
    y = np.asarray(val_labels)
    nearest_even_first = sorted(grid, key=lambda w: abs(w - 0.5))  # stable: equally near, the smaller first
    return best_on_validation((float(w), float(np.mean((w * p_bert_val + (1 - w) * p_tfidf_val).argmax(-1) == y)))
                              for w in nearest_even_first)


def ensemble_report(data: NewsData, bert_val_logits, bert_test_logits,
                    say=print) -> tuple[dict, dict[str, np.ndarray]]:
    """The baselines and the ensemble, for ``metrics.json``: TF-IDF + logistic regression and TF-IDF + LinearSVC
    trained on ``data.train`` (features and ``C`` chosen on ``data.val``, :func:`fit_tfidf`), and
    ``w * softmax(bert) + (1 - w) * p_tfidf`` with each baseline as ``p_tfidf``: ``w`` and the baseline are chosen on
    validation (on a tie, logistic regression). ``bert_val_logits`` and ``bert_test_logits`` are the fine-tuned
    model's ``(posts, classes)`` logits on ``data.val`` and ``data.test``. Returns each one's test scores
    (:func:`bertlib.evaluation.inference.scores`) with its validation accuracy and its choices, and each one's
    ``(test_posts,)`` predicted classes."""
    val_texts, val_labels, test_texts = data.val.texts, data.val.labels, data.test.texts
    report, preds = {}, {}
    shared: dict = {}  # both baselines share each feature set's vectoriser and matrices
    models = {kind: fit_tfidf(data.train.texts, data.train.labels, val_texts, val_labels, kind, fitted_features=shared)
              for kind in ("logreg", "svc")}
    for kind, model in models.items():
        preds[f"tfidf_{kind}"] = model.predict(test_texts)
        report[f"tfidf_{kind}"] = {"val_accuracy": model.val_accuracy, "C": model.C, "features": model.features,
                                   **({"temperature": model.temperature} if kind == "svc" else {})}
    p_val = softmax(bert_val_logits)
    choices = {kind: choose_weight(p_val, tfidf_probabilities(m, val_texts), val_labels) for kind, m in models.items()}
    kind, _ = best_on_validation((k, choices[k][1]) for k in choices)  # the first (logreg) on a tie
    (w, val_acc), member = choices[kind], models[kind]
    preds["ensemble"] = (w * softmax(bert_test_logits) + (1 - w) * tfidf_probabilities(member, test_texts)).argmax(-1)
    report["ensemble"] = {"val_accuracy": val_acc, "bert_weight": w, "tfidf": kind, "C": member.C,
                          "features": member.features,
                          "val_accuracy_with": {k: {"accuracy": a, "bert_weight": g} for k, (g, a) in choices.items()}}
    for name, pred in preds.items():
        report[name] = {**scores(data.test.labels, pred, data.label_names), **report[name]}
    say("[finetune] " + "; ".join(f"{name} test acc {r['accuracy']:.4f} (val {r['val_accuracy']:.4f})"
                                  for name, r in report.items()) + f"; ensemble: BERT with {kind}, weight {w:g}")
    return report, preds


#: Post lengths (WordPiece tokens, no special tokens) at which :func:`accuracy_by_length` cuts the test posts.
LENGTH_EDGES: tuple[int, ...] = (0, 126, 254, 510, 1022)


def accuracy_by_length(lengths, labels, preds: dict[str, np.ndarray], edges=LENGTH_EDGES) -> list[dict]:
    """Accuracy of each method in ``preds`` (name → ``(posts,)`` classes) on the posts of each length bin
    ``[edges[i], edges[i + 1])`` (the last bin open): one dict per non-empty bin with ``"tokens"`` (its range),
    ``"posts"`` and one accuracy per method. With ``max_length = 128`` the first bin fits in one window."""
    lengths, labels = np.asarray(lengths), np.asarray(labels)
    rows = []
    for lo, hi in zip(edges, (*edges[1:], None), strict=True):
        inside = (lengths >= lo) & ((lengths < hi) if hi is not None else True)
        if inside.any():
            rows.append({"tokens": f"{lo}-{hi - 1}" if hi is not None else f">={lo}", "posts": int(inside.sum()),
                         **{name: float(np.mean(np.asarray(p)[inside] == labels[inside]))
                            for name, p in preds.items()}})
    return rows
