"""Write the book's diagrams, ``figures/*.svg``, from this source: ``python figures/make_figures.py``.

Every diagram is plain SVG drawn here with a few helpers (no plotting library, no fonts or images from the web),
so it reads offline and diffs as text. ``tests/test_figures.py`` fails when a committed SVG differs from what this
script writes (run it again after a change), when a ``bertlib`` name a diagram shows no longer exists, or when a
chapter's figure cell points at a missing file or lacks alt text.

Colours: lines and text use ``currentColor`` on a transparent background, with the SVG's ``color`` set to a
near-black; highlights are a translucent orange. In the HTML book's dark mode ``_ext/bertbook/static/bertbook.css``
inverts the lightness of every ``img.bert-diagram`` (and turns the hues back), so lines become light on the dark
page and the highlight stays orange.

Diagrams (``python figures/make_figures.py --list`` prints them):

- ``feed_forward.svg`` (chapter 6): one token's vector widened from H to I numbers, GELU, narrowed back to H.
- ``bert_architecture.svg``: token ids → embeddings → L × encoder layer → pooler → task head, with the ``bertlib``
  functions and tensor shapes (``intro.md``); ``bert_architecture_chNN.svg``: the same with chapter NN's part
  highlighted ("you are here", chapters 2-8).
- ``attention_head.svg`` (chapter 4), ``head_split.svg`` (chapter 5), ``pipeline_stages.svg`` (chapter 10),
  ``mlm_nsp_input.svg`` (chapter 11).
- Shown where they are taught: ``pretrain_finetune.svg`` (chapter 0), ``relative_distance.svg`` (chapter 13),
  ``kv_cache.svg`` (chapter 15, a decoder's key/value cache).
- Offered to the chapters (``OFFERED``): ``post_ln_pre_ln.svg`` (chapter 6), ``sliding_windows.svg`` (chapter 9b).

Notation as in ``notation.md``: layers $L$, heads and tokens numbered from 0, head $a$, $Q = hW_Q^\top + b_Q$.
``tests/test_figures.py`` also checks that every box and label lies inside the canvas.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from html import escape
from pathlib import Path

HERE = Path(__file__).resolve().parent

INK = "#24292f"          # lines and text (currentColor)
HIGHLIGHT = "#f08c00"    # "you are here"
FONT = "'DejaVu Sans', 'Helvetica Neue', Helvetica, Arial, sans-serif"
MONO = "'DejaVu Sans Mono', Menlo, Consolas, monospace"
#: One colour per attention head (head 0, 1, 2, last) in the head-split diagram; readable on white and, inverted
#: and hue-rotated back, on the dark theme.
HEAD_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2")

STYLE = f"""
    text {{ font-family: {FONT}; font-size: 13px; fill: currentColor; }}
    .code {{ font-family: {MONO}; font-size: 12px; }}
    .small {{ font-size: 11.5px; }}
    .title {{ font-weight: bold; }}
    .shape {{ font-family: {MONO}; font-size: 11.5px; opacity: 0.8; }}
    .tag {{ font-size: 11px; opacity: 0.75; }}
    .box {{ fill: none; stroke: currentColor; stroke-width: 1.3; }}
    .frame {{ fill: none; stroke: currentColor; stroke-width: 1.1; stroke-dasharray: 5 4; }}
    .line {{ fill: none; stroke: currentColor; stroke-width: 1.3; }}
    .here {{ fill: {HIGHLIGHT}; fill-opacity: 0.3; stroke: {HIGHLIGHT}; stroke-width: 3; stroke-dasharray: none; }}
    .here-frame {{ fill: {HIGHLIGHT}; fill-opacity: 0.08; stroke: {HIGHLIGHT}; stroke-width: 3;
                  stroke-dasharray: none; }}
    .callout {{ fill: {HIGHLIGHT}; font-weight: bold; }}
    .callout-line {{ fill: none; stroke: {HIGHLIGHT}; stroke-width: 2; }}
"""


# ----------------------------------------------------------------------------------------------- SVG helpers

class Svg:
    """A list of SVG elements in a fixed-size canvas; :meth:`render` gives the file's text."""

    def __init__(self, width: int, height: int, title: str, desc: str) -> None:
        self.width, self.height, self.title, self.desc = width, height, title, desc
        self.items: list[str] = []

    def rect(self, x: float, y: float, w: float, h: float, cls: str = "box", rx: float = 6,
             style: str = "") -> None:
        extra = f' style="{style}"' if style else ""
        self.items.append(f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx:g}" class="{cls}"{extra}/>')

    def text(self, x: float, y: float, s: str, cls: str = "", anchor: str = "start", rotate: bool = False) -> None:
        c = f' class="{cls}"' if cls else ""
        a = f' text-anchor="{anchor}"' if anchor != "start" else ""
        r = f' transform="rotate(-90 {x:g} {y:g})"' if rotate else ""
        self.items.append(f'<text x="{x:g}" y="{y:g}"{c}{a}{r}>{escape(s)}</text>')

    def line(self, points: Iterable[tuple[float, float]], arrow: bool = True, cls: str = "line") -> None:
        pts = " ".join(f"{x:g},{y:g}" for x, y in points)
        marker = ' marker-end="url(#arrow)"' if arrow else ""
        self.items.append(f'<polyline points="{pts}" class="{cls}"{marker}/>')

    def render(self) -> str:
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                f'viewBox="0 0 {self.width} {self.height}" role="img" aria-labelledby="title desc" '
                f'style="color: {INK}; background: transparent">\n'
                f'<title id="title">{escape(self.title)}</title>\n<desc id="desc">{escape(self.desc)}</desc>\n'
                f'<style>{STYLE}</style>\n'
                '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
                'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="currentColor"/></marker></defs>\n')
        return head + "\n".join(self.items) + "\n</svg>\n"


def _box(svg: Svg, x: float, y: float, w: float, h: float, lines: list[tuple[str, str]], here: bool = False,
         frame: bool = False) -> None:
    """A box with centred lines of text, each ``(text, css class)``."""
    svg.rect(x, y, w, h, ("here-frame" if frame else "here") if here else ("frame" if frame else "box"))
    step = 16
    top = y + h / 2 - (len(lines) - 1) * step / 2 + 4.5
    for i, (s, cls) in enumerate(lines):
        svg.text(x + w / 2, top + i * step, s, cls, anchor="middle")


# ------------------------------------------------------------------------------------------ the architecture

#: The parts of the architecture diagram each chapter highlights.
CHAPTER_PARTS: dict[int, tuple[str, ...]] = {
    2: ("embeddings",),
    3: ("ln_embeddings", "ln_attention", "ln_ffn"),
    4: ("head_0",),
    5: ("self_attention",),
    6: ("encoder_layer", "attention_output", "feed_forward"),
    7: ("encoder",),
    8: ("pooler", "task_head"),
}
CHAPTER_TITLES = {2: "Embeddings", 3: "LayerNorm", 4: "Attention, one head", 5: "All heads, batched",
                  6: "The encoder layer", 7: "The encoder loop", 8: "Pooler and classifier head"}
#: Which bertlib names each chapter's part is, for the caption and the "you are here" note.
CHAPTER_NAMES = {2: "bertlib.embeddings", 3: "bertlib.layer_norm", 4: "bertlib.attention_head",
                 5: "bertlib.self_attention", 6: "bertlib.encoder_layer", 7: "bertlib.encoder",
                 8: "bertlib.pooler, bertlib.tasks.classifier.BertClassifier"}

#: Every bertlib name a diagram shows (tests/test_figures.py checks that each one exists).
BERTLIB_NAMES = (
    "embeddings", "layer_norm", "attention_head", "extended_attention_mask", "transpose_for_scores",
    "self_attention", "attention_output", "feed_forward", "encoder_layer", "encoder", "bert_forward", "pooler",
    "tasks.classifier.BertClassifier", "head_slice", "tasks.pipeline.preprocess", "tasks.pipeline.forward",
    "tasks.pipeline.postprocess", "tasks.pipeline.classify", "data.pretraining_data.mask_tokens",
    "data.pretraining_data.nsp_pairs", "data.pretraining_data.tokenize_pairs", "tasks.heads.mlm_logits",
    "tasks.heads.nsp_logits", "data.windows.split_windows", "data.windows.pool_windows",
)


def architecture(chapter: int | None = None) -> Svg:
    """BERT from token ids to the task head; ``chapter`` (2-8) highlights that chapter's part."""
    here = set(CHAPTER_PARTS.get(chapter, ())) if chapter else set()
    if chapter:
        title = f"You are here: chapter {chapter}, {CHAPTER_TITLES[chapter]}, in BERT's architecture"
        desc = (f"BERT's forward pass from token ids to the task head, with chapter {chapter}'s part "
                f"({CHAPTER_NAMES[chapter]}) highlighted in orange.")
    else:
        title, desc = "BERT's architecture, with the bertlib functions that compute each part", ""
    desc = (desc + " Token ids (batch, seq) go into the embeddings (word + token type + position, then LayerNorm; "
            "bertlib.embeddings), giving (batch, seq, hidden). The encoder (bertlib.encoder) applies L encoder layers "
            "(bertlib.encoder_layer), numbered 0 to L - 1, each: multi-head self-attention with heads 0 to A - 1 "
            "(bertlib.self_attention; one head is bertlib.attention_head), then dense, dropout, add and LayerNorm "
            "(bertlib.attention_output), then the feed-forward dense (to the intermediate width), GELU, dense "
            "(back to hidden), dropout, add and LayerNorm (bertlib.feed_forward). The pooler "
            "(bertlib.pooler) turns the [CLS] vector into (batch, hidden); the task head "
            "(bertlib.tasks.classifier.BertClassifier) "
            "gives (batch, num_labels) logits.").strip()
    W, L, R = 700, 60, 500          # canvas width; main column from L to R
    cx = (L + R) / 2
    svg = Svg(W, 822, title, desc)
    callouts: list[float] = []      # y of each highlighted element's centre (first one gets the note)

    def mark(part: str, y: float) -> bool:
        if part in here:
            callouts.append(y)
            return True
        return False

    def tag(y: float, s: str) -> None:
        svg.text(L - 8, y + 4, s, "tag", anchor="end")

    def shape(y: float, s: str) -> None:
        svg.text(cx + 10, y + 4, s, "shape")

    # token ids
    _box(svg, L, 14, R - L, 44, [("Token ids from the tokenizer", "title"),
                                 ("input_ids, token_type_ids, attention_mask", "code")])
    tag(36, "ch. 1")
    svg.line([(cx, 58), (cx, 88)])
    shape(75, "(batch, seq)")

    # embeddings
    y = 88
    svg.rect(L, y, R - L, 118, "here-frame" if mark("embeddings", y + 59) else "frame")
    svg.text(L + 12, y + 20, "Embeddings", "title")
    svg.text(R - 12, y + 20, "bertlib.embeddings", "code", anchor="end")
    tag(y + 59, "ch. 2")
    chips = [("word[input_ids]", 118), ("token type (segment)", 150), ("position", 92)]   # notation.md's order
    x = L + 18
    for i, (s, w) in enumerate(chips):
        _box(svg, x, y + 32, w, 28, [(s, "small")])
        if i < len(chips) - 1:
            svg.text(x + w + 5, y + 51, "+", "title", anchor="start")
        x += w + 20
    svg.line([(cx, y + 60), (cx, y + 74)])
    _box(svg, L + 20, y + 76, R - L - 40, 30, [("LayerNorm (bertlib.layer_norm) · dropout", "small")],
         here=mark("ln_embeddings", y + 91))
    tag(y + 95, "ch. 3")
    svg.line([(cx, y + 118), (cx, y + 150)])
    shape(y + 136, "(batch, seq, hidden)")

    # encoder and one encoder layer
    y = 238
    svg.rect(L - 2, y, R - L + 4, 392, "here-frame" if mark("encoder", y + 196) else "frame")
    svg.text(L + 10, y + 20, "Encoder: L layers", "title")
    svg.text(R - 10, y + 20, "bertlib.encoder", "code", anchor="end")
    tag(y + 20, "ch. 7")
    ly = y + 34
    svg.rect(L + 8, ly, R - L - 16, 346, "here-frame" if mark("encoder_layer", ly + 173) else "frame")
    svg.text(L + 20, ly + 20, "Encoder layer (one of L)", "title")
    svg.text(R - 18, ly + 20, "bertlib.encoder_layer", "code", anchor="end")
    tag(ly + 60, "ch. 6")
    bx, bw = L + 40, R - L - 60                   # boxes inside the layer
    # multi-head self-attention
    ay = ly + 40
    svg.line([(cx, ly + 28), (cx, ay)])
    sa = mark("self_attention", ay + 45)
    svg.rect(bx, ay, bw, 90, "here" if sa else "box")
    svg.text(bx + 10, ay + 18, "Multi-head self-attention", "title")
    svg.text(bx + bw - 10, ay + 18, "bertlib.self_attention", "code", anchor="end")
    tag(ay + 45, "ch. 4-5")
    hx, hy = bx + 12, ay + 28
    _box(svg, hx, hy, 130, 36, [("head 0", "small"), ("attention_head", "code")], here=mark("head_0", hy + 18))
    for i, s in enumerate(("head 1", "…", "head A−1")):
        _box(svg, hx + 140 + i * 66, hy, 60, 36, [(s, "small")])
    svg.text(bx + bw / 2, ay + 82, "split: (batch, heads, seq, head_size) · merge back", "shape", anchor="middle")
    # attention output: dense, dropout, add & LayerNorm
    oy = ay + 110
    svg.line([(cx, ay + 90), (cx, oy)])
    ao = mark("attention_output", oy + 32)
    svg.rect(bx, oy, bw, 64, "here" if ao else "box")
    svg.text(bx + 10, oy + 18, "Attention output", "title")
    svg.text(bx + bw - 10, oy + 18, "bertlib.attention_output", "code", anchor="end")
    _box(svg, bx + 12, oy + 28, 230, 28, [("dense · dropout", "small")])
    _box(svg, bx + 256, oy + 28, 114, 28, [("add & LayerNorm", "small")], here=mark("ln_attention", oy + 42))
    svg.line([(bx + 242, oy + 42), (bx + 254, oy + 42)])
    # feed-forward
    fy = oy + 84
    svg.line([(cx, oy + 64), (cx, fy)])
    ff = mark("feed_forward", fy + 38)
    svg.rect(bx, fy, bw, 78, "here" if ff else "box")
    svg.text(bx + 10, fy + 18, "Feed-forward", "title")
    svg.text(bx + bw - 10, fy + 18, "bertlib.feed_forward", "code", anchor="end")
    _box(svg, bx + 12, fy + 26, 230, 40, [("dense → GELU → dense · dropout", "small"),
                                           ("hidden → intermediate → hidden", "shape")])
    _box(svg, bx + 256, fy + 34, 114, 28, [("add & LayerNorm", "small")], here=mark("ln_ffn", fy + 48))
    svg.line([(bx + 242, fy + 48), (bx + 254, fy + 48)])
    # residual connections: the layer's input to the first add, the attention output to the second
    svg.line([(cx, ly + 33), (bx - 14, ly + 33), (bx - 14, oy + 61), (bx + 313, oy + 61), (bx + 313, oy + 57)])
    svg.line([(cx, oy + 74), (bx - 8, oy + 74), (bx - 8, fy + 71), (bx + 313, fy + 71), (bx + 313, fy + 63)])
    svg.text(bx - 17, oy - 30, "residual", "tag", anchor="middle", rotate=True)
    # back to the top for the next layer
    svg.line([(cx, fy + 78), (cx, ly + 346)], arrow=False)
    svg.line([(R - 8, ly + 330), (R + 14, ly + 330), (R + 14, ly + 8), (R - 8, ly + 8)], cls="line")
    svg.text(R + 19, ly + 70, "× L", "title")

    # pooler and task head
    py = y + 392 + 30
    svg.line([(cx, y + 392), (cx, py)])
    shape(y + 408, "(batch, seq, hidden)  last_hidden_state")
    po = mark("pooler", py + 22)
    _box(svg, L, py, R - L, 44, [("Pooler: [CLS] vector → dense → tanh", "title"), ("bertlib.pooler", "code")],
         here=po)
    tag(py + 26, "ch. 8")
    ty = py + 44 + 30
    svg.line([(cx, py + 44), (cx, ty)])
    shape(py + 60, "(batch, hidden)  pooler_output")
    th = mark("task_head", ty + 22)
    _box(svg, L, ty, R - L, 44, [("Task head: dropout → dense → logits", "title"),
                                 ("bertlib.tasks.classifier.BertClassifier", "code")], here=th)
    tag(ty + 26, "ch. 8-9")
    svg.line([(cx, ty + 44), (cx, ty + 70)])
    shape(ty + 60, "(batch, num_labels)  logits")
    svg.text(R + 12, 30, "bert_forward =", "code")
    svg.text(R + 12, 46, "embeddings + encoder", "code")
    svg.text(R + 12, 62, "+ pooler (chapter 7)", "code")

    if callouts:
        cy = callouts[0]
        svg.line([(R + 92, cy), (R + 4, cy)], cls="callout-line")
        svg.text(R + 96, cy - 2, "you are", "callout")
        svg.text(R + 96, cy + 14, "here:", "callout")
        svg.text(R + 96, cy + 30, f"chapter {chapter}", "callout")
    return svg


# -------------------------------------------------------------------------------------------- one head (ch. 4)

def attention_head() -> Svg:
    """Chapter 4: one head's Q, K, V → scores → mask → softmax → context, with shapes."""
    svg = Svg(700, 330, "One attention head: queries, keys, values, scores, mask, softmax, context",
              "The layer input h (batch, seq, hidden) is projected with head a's rows of the query, key and value "
              "weights (bertlib.head_slice) into Q, K and V of shape (batch, seq, head_size). Scores are Q times K "
              "transposed divided by the square root of head_size, (batch, seq, seq); the additive padding mask "
              "(bertlib.extended_attention_mask: 0 for real keys, the most negative float for padding) is added; a "
              "softmax over the keys gives the probabilities alpha, whose rows sum to 1; alpha times V gives the "
              "head's context, (batch, seq, head_size). bertlib.attention_head computes all of it.")
    svg.text(350, 20, "bertlib.attention_head(state_dict, config, hidden, head, mask)", "code", anchor="middle")
    _box(svg, 6, 135, 110, 56, [("h", "title"), ("(batch, seq,", "shape"), ("hidden)", "shape")])
    names = [("Q = h W_Qᵀ + b_Q", 60), ("K = h W_Kᵀ + b_K", 150), ("V = h W_Vᵀ + b_V", 240)]
    for s, y in names:
        svg.line([(116, 163), (132, 163), (132, y + 22), (148, y + 22)])
        _box(svg, 150, y, 176, 44, [(s, "small"), ("(batch, seq, head_size)", "shape")])
    svg.text(238, 48, "head a's rows a·d … (a+1)·d − 1: head_slice", "tag", anchor="middle")
    # scores from Q and K
    svg.line([(326, 82), (338, 82), (338, 100), (344, 100)])
    svg.line([(326, 172), (338, 172), (338, 118), (344, 118)])
    _box(svg, 346, 86, 158, 46, [("scores = Q Kᵀ / √d", "small"), ("(batch, seq, seq)", "shape")])
    svg.line([(425, 132), (425, 154)])
    _box(svg, 346, 156, 158, 46, [("+ mask M", "small"), ("0 real, finfo.min pad", "shape")])
    svg.text(512, 176, "extended_attention_mask", "code")
    svg.text(512, 192, "(batch, 1, 1, seq)", "shape")
    svg.line([(425, 202), (425, 224)])
    _box(svg, 346, 226, 158, 46, [("α = softmax over keys", "small"), ("rows sum to 1", "shape")])
    # context = probs @ V
    svg.line([(504, 249), (600, 249), (600, 268)])
    svg.line([(326, 262), (338, 262), (338, 296), (518, 296)])
    _box(svg, 520, 270, 176, 50, [("context = α V", "small"), ("(batch, seq, head_size)", "shape")])
    return svg


# ----------------------------------------------------------------------------------------- head split (ch. 5)

def head_split() -> Svg:
    """Chapter 5: one projection for all heads, then view + permute into (batch, heads, seq, head_size)."""
    svg = Svg(700, 430, "Splitting the projected queries into heads with view and permute",
              "Top: the projected queries (batch, seq, hidden) for tokens 0, 1 and 2; each row is split into A "
              "blocks of head_size numbers, one colour per head (heads 0 to A - 1). Middle: "
              "view(batch, seq, heads, head_size) cuts each "
              "token's row into its heads' blocks, stacked. Bottom: permute(0, 2, 1, 3) makes heads the second "
              "dimension, (batch, heads, seq, head_size): each head gets a seq by head_size matrix of its own, the "
              "input of chapter 4's computation. bertlib.transpose_for_scores does both steps; permute back and "
              "reshape to (batch, seq, hidden) merges the heads again.")
    heads = ("head 0", "head 1", "head 2", "head A−1")
    cell, tokens = 14, ("t0", "t1", "t2")
    seg = 4 * cell                                                   # head_size drawn as 4 cells

    def block(x: float, y: float, colour: str, cols: int = 4) -> None:
        svg.rect(x, y, cols * cell, cell, "box", rx=0, style=f"fill: {colour}; fill-opacity: 0.45")

    # 1. projected: (batch, seq, hidden)
    svg.text(10, 22, "1. q = F.linear(hidden, W_Q, b_Q)", "code")
    svg.text(690, 22, "(batch, seq, hidden)", "shape", anchor="end")
    x0 = 120
    for r, t in enumerate(tokens):
        y = 36 + r * (cell + 2)
        svg.text(x0 - 10, y + 11, t, "small", anchor="end")
        for h, colour in enumerate(HEAD_COLOURS):
            gap = 30 if h == 3 else 0
            block(x0 + h * (seg + 4) + gap, y, colour)
        svg.text(x0 + 3 * (seg + 4) + 13, y + 11, "…", "small", anchor="middle")
    for h, name in enumerate(heads):
        svg.text(x0 + h * (seg + 4) + (30 if h == 3 else 0) + seg / 2, 100, name, "tag", anchor="middle")
    svg.text(x0 + 4 * (seg + 4) + 40, 60, "hidden = heads × head_size", "small")
    # 2. view
    svg.line([(350, 108), (350, 128)])
    svg.text(10, 148, "2. .view(batch, seq, heads, head_size)", "code")
    svg.text(690, 148, "(batch, seq, heads, head_size)", "shape", anchor="end")
    for r, t in enumerate(tokens):
        x = 120 + r * 150
        svg.text(x + seg / 2, 166, t, "small", anchor="middle")
        for h, colour in enumerate(HEAD_COLOURS):
            block(x, 174 + h * (cell + 2) + (8 if h == 3 else 0), colour)
        svg.text(x + seg / 2, 174 + 3 * (cell + 2) + 5, "⋮", "small", anchor="middle")
    svg.text(570, 200, "each token's row,", "small")
    svg.text(570, 216, "cut into its heads", "small")
    # 3. permute
    svg.line([(350, 256), (350, 276)])
    svg.text(10, 296, "3. .permute(0, 2, 1, 3)", "code")
    svg.text(690, 296, "(batch, heads, seq, head_size)", "shape", anchor="end")
    for h, (name, colour) in enumerate(zip(heads, HEAD_COLOURS, strict=True)):
        x = 120 + h * 110 + (30 if h == 3 else 0)
        svg.text(x + seg / 2, 316, name, "small", anchor="middle")
        for r, t in enumerate(tokens):
            block(x, 324 + r * (cell + 2), colour)
            if h == 0:
                svg.text(x - 8, 324 + r * (cell + 2) + 11, t, "tag", anchor="end")
    svg.text(120 + 3 * 110 + 5, 350, "…", "title", anchor="middle")
    svg.text(10, 396, "Each head now owns a (seq, head_size) matrix: chapter 4's head, for all heads in one matmul.",
             "small")
    svg.text(10, 416, "bertlib.transpose_for_scores = steps 2-3; merging = permute back + reshape(batch, seq, hidden).",
             "small")
    return svg


# ---------------------------------------------------------------------------------------- pipeline (ch. 10)

def pipeline_stages() -> Svg:
    """Chapter 10: pipe(text) = preprocess → _forward → postprocess."""
    svg = Svg(720, 300, "The three stages of a text-classification pipeline",
              "A text goes through preprocess (the tokenizer adds [CLS] and [SEP] and gives input_ids, "
              "token_type_ids and attention_mask of shape (1, seq); it does not truncate unless asked to, so "
              "pass truncation=True for long texts; bertlib.tasks.pipeline.preprocess), then _forward (the model in "
              "eval mode under no_grad: logits of shape (1, num_labels); bertlib.tasks.pipeline.forward), then "
              "postprocess (softmax or sigmoid, the best label and its score; bertlib.tasks.pipeline.postprocess). "
              "bertlib.tasks.pipeline.classify runs the three in batches.")
    svg.text(360, 20, 'pipe("some post")  →  [{"label": "sci.space", "score": 0.93}]', "code", anchor="middle")
    stages = [
        ("1. preprocess", ("tokenizer: add [CLS], [SEP]", "no truncation unless asked"),
         "(1, seq) ids, segments, mask", "pipe.preprocess", "tasks.pipeline.preprocess"),
        ("2. _forward", ("model.eval()", "torch.no_grad()"), "(1, num_labels) logits",
         "pipe.forward", "tasks.pipeline.forward"),
        ("3. postprocess", ("softmax (or sigmoid)", "top label and its score"), '{"label": ..., "score": ...}',
         "pipe.postprocess", "tasks.pipeline.postprocess"),
    ]
    w, gap, y = 220, 20, 48
    for i, (name, what, out, theirs, ours) in enumerate(stages):
        x = 10 + i * (w + gap)
        _box(svg, x, y, w, 150, [(name, "title"), (what[0], "small"), (what[1], "small"), ("", ""),
                                 (theirs, "code"), (ours, "code"), ("", ""), (out, "shape")])
        if i < len(stages) - 1:
            svg.line([(x + w, y + 75), (x + w + gap - 2, y + 75)])
    svg.line([(10, 222), (710, 222)], arrow=True)
    svg.text(360, 244, "bertlib.tasks.pipeline.classify(classifier, tokenizer, texts, id2label): all three, in batches",
             "code", anchor="middle")
    svg.text(360, 270, "Transformers' Pipeline.run_single calls the same three stages; chapter 10 proves each equal.",
             "small", anchor="middle")
    return svg


# ------------------------------------------------------------------------------------------- MLM/NSP (ch. 11)

def mlm_nsp_input() -> Svg:
    """Chapter 11: one pre-training example: tokens, segments, positions, masking and the two targets."""
    tokens = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]", "it", "was", "warm", "[SEP]"]
    masked = ["[CLS]", "the", "[MASK]", "sat", "on", "the", "dog", "[SEP]", "it", "was", "warm", "[SEP]"]
    labels = ["-100", "-100", "cat", "-100", "-100", "-100", "mat", "-100", "-100", "was", "-100", "-100"]
    segments = [0] * 8 + [1] * 4
    svg = Svg(700, 344, "A pre-training input: a sentence pair, masked tokens and the two targets",
              "Sentence A 'the cat sat on the mat' and sentence B 'it was warm' are packed as [CLS] A [SEP] B [SEP], "
              "with segment ids 0 for [CLS], A and the first [SEP], and 1 for B and the last [SEP], and positions 0 "
              "to 11. Masking (bertlib.data.pretraining_data.mask_tokens) chooses about 15% of the non-special "
              "tokens; the "
              "picture chooses 3 of the 9, far more than 15%, so that each of the three cases shows: "
              "'cat' becomes [MASK] (80% of chosen tokens), 'mat' becomes a random token 'dog' (10%) and 'was' stays "
              "unchanged (10%). The MLM labels hold the original token at the chosen positions and -100 elsewhere. "
              "The NSP label says whether B really followed A (IsNext) or was drawn from another document "
              "(NotNext); it is predicted from the pooled [CLS] vector (bertlib.tasks.heads.nsp_logits).")
    x0, cw = 112, 48
    rows = [("tokens", tokens), ("segment ids", [str(s) for s in segments]),
            ("positions", [str(i) for i in range(len(tokens))]), ("after masking", masked), ("MLM labels", labels)]
    svg.text(x0 + 4 * cw, 18, "sentence A", "tag", anchor="middle")
    svg.text(x0 + 9.5 * cw, 18, "sentence B", "tag", anchor="middle")
    svg.line([(x0 + cw + 2, 24), (x0 + 7 * cw - 2, 24)], arrow=False)
    svg.line([(x0 + 8 * cw + 2, 24), (x0 + 11 * cw - 2, 24)], arrow=False)
    for r, (name, values) in enumerate(rows):
        y = 34 + r * 40
        svg.text(x0 - 8, y + 19, name, "small", anchor="end")
        for i, v in enumerate(values):
            chosen = r >= 3 and i in (2, 6, 9)
            seg_b = r == 1 and segments[i] == 1
            style = ""
            if chosen:
                style = f"fill: {HIGHLIGHT}; fill-opacity: 0.3"
            elif seg_b:
                style = f"fill: {HEAD_COLOURS[0]}; fill-opacity: 0.25"
            svg.rect(x0 + i * cw, y, cw - 2, 28, "box", rx=3, style=style)
            svg.text(x0 + i * cw + (cw - 2) / 2, y + 18, v, "code" if len(v) < 6 else "code small", anchor="middle")
    svg.text(x0 + 2 * cw + 23, 250, "80%: [MASK]", "tag", anchor="middle")
    svg.text(x0 + 6 * cw + 23, 250, "10%: random", "tag", anchor="middle")
    svg.text(x0 + 9 * cw + 23, 250, "10%: kept", "tag", anchor="middle")
    svg.text(10, 276, "bertlib.data.pretraining_data.mask_tokens picks ~15% of the non-special tokens; the MLM loss "
             "sees only them.", "small")
    svg.text(10, 296, "Here 3 of the 9 are chosen, exaggerated so that all three cases show (mlm_logits scores "
             "them).", "small")
    svg.text(10, 316, "NSP label: IsNext / NotNext (nsp_pairs), predicted from the pooled [CLS] vector by "
             "nsp_logits.", "small")
    svg.text(10, 336, "tokenize_pairs packs pairs as [CLS] A [SEP] B [SEP] with segment ids 0 / 1.", "small")
    return svg


# ------------------------------------------------------------------------- pre-train, then fine-tune (ch. 9, 11)

def pretrain_finetune() -> Svg:
    """Devlin et al.'s Figure 1 idea in the book's notation: one encoder, pre-trained, then fine-tuned with a head."""
    svg = Svg(740, 380, "Pre-training, then fine-tuning: the same encoder with a different head",
              "Left, pre-training (chapter 11): unlabelled text packed as [CLS] A [SEP] B [SEP], with some tokens "
              "replaced by [MASK], goes through the encoder (L layers of width H). The masked-LM head predicts the "
              "original token at each masked position and the next-sentence head predicts from [CLS] whether B "
              "followed A. Right, fine-tuning (chapter 9): the encoder starts from the pre-trained weights; a post "
              "packed as [CLS] text [SEP] goes through it, and a new classifier head, initialised at random, turns "
              "the [CLS] vector into C logits, one per class. All the weights, the encoder's and the head's, train "
              "on the labelled posts.")
    panels = [
        (10, "Pre-training (chapter 11)", "unlabelled text, two self-made tasks",
         ["[CLS]", "the", "cat", "[MASK]", "[SEP]", "it", "[SEP]"], {3}),
        (400, "Fine-tuning (chapter 9)", "labelled posts, one task",
         ["[CLS]", "my", "disk", "is", "full", "[SEP]"], set()),
    ]
    pw, cw = 330, 46
    for x, title, sub, tokens, masked in panels:
        svg.rect(x, 30, pw, 300, "frame")
        svg.text(x + 12, 50, title, "title")
        svg.text(x + 12, 68, sub, "tag")
        x0 = x + (pw - len(tokens) * cw) / 2
        for i, tok in enumerate(tokens):      # the input tokens, bottom
            style = f"fill: {HIGHLIGHT}; fill-opacity: 0.3" if i in masked else ""
            svg.rect(x0 + i * cw, 284, cw - 4, 28, "box", rx=3, style=style)
            svg.text(x0 + i * cw + (cw - 4) / 2, 302, tok, "code small", anchor="middle")
            svg.line([(x0 + i * cw + (cw - 4) / 2, 284), (x0 + i * cw + (cw - 4) / 2, 246)])
        _box(svg, x + 20, 186, pw - 40, 58, [("BERT encoder", "title"), ("L layers, width H", "small"),
                                              ("bertlib.encoder", "code")])
        cls_x = x0 + (cw - 4) / 2
        if masked:
            m_x = x0 + 3 * cw + (cw - 4) / 2
            svg.line([(cls_x, 186), (cls_x, 128)])
            svg.line([(m_x, 186), (m_x, 128)])
            _box(svg, x + 8, 84, 122, 42, [("NSP head", "small"), ("IsNext / NotNext", "shape")])
            _box(svg, x + 142, 84, 178, 42, [("masked-LM head", "small"), ("the original: 'sat'", "shape")])
        else:
            svg.line([(cls_x, 186), (cls_x, 128)])
            _box(svg, x + 12, 84, 200, 42, [("new classifier head", "small"), ("C logits: comp.sys.mac...?", "shape")])
    # the weights carry over
    svg.line([(320, 215), (418, 215)])
    svg.text(370, 205, "weights", "tag", anchor="middle")
    svg.text(370, 232, "copied", "tag", anchor="middle")
    svg.text(10, 352, "Pre-training learns the encoder once, from raw text; fine-tuning starts from it and trains "
             "every weight", "small")
    svg.text(10, 370, "again, with a small learning rate and a new head, for a few epochs on one task's labels.",
             "small")
    return svg


# ------------------------------------------------------------------------------------ post-LN and pre-LN (ch. 6)

def post_ln_pre_ln() -> Svg:
    """Chapter 6: where LayerNorm sits around a residual sub-layer, BERT's post-LN beside pre-LN."""
    svg = Svg(700, 400, "A residual sub-layer with LayerNorm after the add (post-LN, BERT) and before the "
                        "sub-layer (pre-LN)",
              "Two blocks side by side, each reading the layer input h at the top. Post-LN, as in BERT and the "
              "original Transformer: h goes into the sub-layer (attention or feed-forward), the sub-layer's output "
              "is added to h through the residual connection, and LayerNorm normalises the sum: "
              "LN(h + sublayer(h)). Pre-LN, as in GPT-2 and most later models: LayerNorm normalises h first, the "
              "sub-layer reads the normalised vector, and its output is added to h itself: h + sublayer(LN(h)). "
              "In pre-LN the residual path from the output back to the input crosses no LayerNorm, so gradients "
              "reach the early layers undiminished; in post-LN every layer's LayerNorm lies on that path.")

    def column(x: float, title: str, formula: str, steps: list[str]) -> None:
        svg.text(x + 150, 24, title, "title", anchor="middle")
        svg.text(x + 150, 42, formula, "code", anchor="middle")
        _box(svg, x + 90, 56, 120, 32, [("h (layer input)", "small")])
        y = 88
        for i, step in enumerate(steps):
            top = 116 + i * 70
            svg.line([(x + 150, y), (x + 150, top)])
            if step == "add":
                svg.rect(x + 130, top, 40, 32, "box", rx=16)
                svg.text(x + 150, top + 21, "+", "title", anchor="middle")
                add_y = top + 16
            else:
                _box(svg, x + 70, top, 160, 32, [(step, "small")], here=step == "LayerNorm")
            y = top + 32
        svg.line([(x + 150, y), (x + 150, y + 30)])
        svg.text(x + 150, y + 46, "output: the next sub-layer's h", "small", anchor="middle")
        # the residual connection: from h, down the side, into the add
        svg.line([(x + 210, 72), (x + 262, 72), (x + 262, add_y), (x + 172, add_y)])
        svg.text(x + 278, (72 + add_y) / 2, "residual", "tag", anchor="middle", rotate=True)

    column(20, "Post-LN (BERT)", "LN(h + sublayer(h))", ["sublayer(h)", "add", "LayerNorm"])
    column(370, "Pre-LN (GPT-2, later models)", "h + sublayer(LN(h))", ["LayerNorm", "sublayer(·)", "add"])
    svg.line([(350, 56), (350, 330)], arrow=False, cls="frame")
    svg.text(10, 372, "Post-LN puts a LayerNorm on the residual path of every layer; pre-LN leaves a clean path from "
             "output to input", "small")
    svg.text(10, 390, "and needs one more LayerNorm after the last layer. sublayer = attention or feed-forward "
             "(chapter 6).", "small")
    return svg


def feed_forward() -> Svg:
    """Chapter 6: the feed-forward sub-layer widens each token's vector from H to I numbers, gates it with GELU and
    narrows it back to H."""
    svg = Svg(700, 372, "The feed-forward sub-layer: widen from H to I numbers, GELU, narrow back to H",
              "One token's vector, H numbers wide (hidden_size), is multiplied by W_1 transposed and shifted by b_1 "
              "into I numbers (intermediate_size, four times H in BERT): the tall bar. GELU then acts on each of "
              "the I numbers alone, keeping the large positive ones and pushing the negative ones to about zero "
              "(the shaded cells are the ones it keeps). W_2 transposed and b_2 project the I numbers back to H. "
              "Every token goes through the same weights on its own: no token reads another here. "
              "bertlib.feed_forward adds the result to its input and applies LayerNorm.")
    cy, h_bar, i_bar, w = 196, 72, 288, 30        # centre line; bar heights in the ratio H : I = 1 : 4
    xs = [70, 262, 420, 602]                      # the four bars: input, widened, after GELU, output
    tops = [cy - h_bar / 2, cy - i_bar / 2, cy - i_bar / 2, cy - h_bar / 2]
    heights = [h_bar, i_bar, i_bar, h_bar]
    svg.text(350, 22, "bertlib.feed_forward, one token at a time", "code", anchor="middle")
    for x, top, height in zip(xs, tops, heights, strict=True):
        svg.rect(x, top, w, height, "box", rx=3)
    n_cells = 36
    for i in range(n_cells):                      # the widened vector after GELU: some numbers kept, most ~0
        if (i * 7) % 5 < 2:
            svg.rect(xs[2] + 3, tops[2] + i * i_bar / n_cells + 1, w - 6, i_bar / n_cells - 2, "here", rx=1)
    # widen (W_1) and narrow (W_2): the fans between the bars
    for (x0, t0, b0), (x1, t1, b1) in [((xs[0] + w, tops[0], tops[0] + h_bar), (xs[1], tops[1], tops[1] + i_bar)),
                                       ((xs[2] + w, tops[2], tops[2] + i_bar), (xs[3], tops[3], tops[3] + h_bar))]:
        svg.line([(x0, t0), (x1, t1)], arrow=False, cls="frame")
        svg.line([(x0, b0), (x1, b1)], arrow=False, cls="frame")
        svg.line([(x0 + 4, cy), (x1 - 4, cy)])
    svg.text(181, cy - 10, "× W_1ᵀ + b_1", "code", anchor="middle")
    svg.text(181, cy + 24, "widen: H → I", "small", anchor="middle")
    svg.text(526, cy - 10, "× W_2ᵀ + b_2", "code", anchor="middle")
    svg.text(526, cy + 24, "narrow: I → H", "small", anchor="middle")
    svg.line([(xs[1] + w + 4, cy), (xs[2] - 4, cy)])
    svg.text(356, cy - 10, "GELU", "title", anchor="middle")
    svg.text(356, cy + 24, "each number", "small", anchor="middle")
    svg.text(356, cy + 40, "alone", "small", anchor="middle")
    for x, top, height, name, size in [(xs[0], tops[0], h_bar, "h̃ₜ (input)", "H = hidden_size"),
                                       (xs[3], tops[3], h_bar, "output", "H numbers")]:
        svg.text(x + w / 2, top + height + 18, name, "small", anchor="middle")
        svg.text(x + w / 2, top + height + 34, size, "shape", anchor="middle")
    svg.text(xs[1] - 8, cy, "I = intermediate_size", "shape", anchor="end")
    svg.text(xs[1] - 8, cy + 16, "(4H in BERT)", "shape", anchor="end")
    svg.text(xs[2] + w + 8, tops[2] + 12, "kept by GELU", "tag")
    return svg


# ---------------------------------------------------------------------------- windows over a long post (ch. 9b)

def sliding_windows() -> Svg:
    """Chapter 9b: a long post cut into overlapping windows that share ``stride`` tokens (bertlib.data.windows)."""
    n, room, stride = 28, 10, 3
    step = room - stride
    starts = list(range(0, n - stride, step))
    svg = Svg(790, 370, "Sliding windows with a stride over a long post",
              f"A post of {n} tokens, longer than one window, is cut into windows of max_length tokens: [CLS], "
              f"room = max_length - 2 = {room} tokens of the post, and [SEP]. Consecutive windows share stride = "
              f"{stride} tokens, so each starts {step} = room - stride tokens after the previous one: tokens "
              + ", ".join(f"{a} to {min(a + room, n) - 1}" for a in starts) +
              ". The last window is shorter and is padded. Every token is in at least one window. Each window goes "
              "through BERT on its own, giving one vector per window; the post's vector pools them (mean, max or "
              "attention over the windows) before the classifier (bertlib.data.windows.split_windows, "
              "bertlib.data.windows.pool_windows).")
    x0, cw, cap = 120, 20, 40                # first token's x, one token's width, a [CLS]/[SEP] cell's width
    svg.text(10, 24, f"A post of {n} tokens (the text's tokens, before [CLS] and [SEP] are added)", "small")
    for t in range(n):
        svg.rect(x0 + t * cw, 36, cw - 3, 22, "box", rx=2)
        svg.text(x0 + t * cw + (cw - 3) / 2, 51, str(t), "tag", anchor="middle")
    for w, a in enumerate(starts):
        b = min(a + room, n)
        y = 84 + w * 48
        colour = HEAD_COLOURS[w % len(HEAD_COLOURS)]
        svg.text(10, y + 18, f"window {w}", "small")
        svg.rect(x0 + a * cw - cap - 2, y, cap, 26, "box", rx=3)
        svg.text(x0 + a * cw - cap / 2 - 2, y + 17, "[CLS]", "code small", anchor="middle")
        svg.rect(x0 + a * cw, y, (b - a) * cw - 3, 26, "box", rx=3, style=f"fill: {colour}; fill-opacity: 0.3")
        svg.text(x0 + (a + stride + b) / 2 * cw, y + 17, f"{a}–{b - 1}", "shape", anchor="middle")
        svg.rect(x0 + b * cw - 1, y, cap, 26, "box", rx=3)
        svg.text(x0 + b * cw - 1 + cap / 2, y + 17, "[SEP]", "code small", anchor="middle")
        if b - a < room:                      # the last window is shorter: padding fills it up
            px = x0 + b * cw + cap + 1
            svg.rect(px, y, (room - (b - a)) * cw, 26, "frame", rx=3)
            svg.text(px + (room - (b - a)) * cw / 2, y + 17, "pad", "tag", anchor="middle")
        if w:
            svg.rect(x0 + a * cw - 2, y - 3, stride * cw + 1, 32, "callout-line", rx=3)
    svg.text(x0 + (starts[1] + stride / 2) * cw, 84 + 48 + 44, f"stride = {stride}", "callout", anchor="middle")
    svg.text(x0 + (starts[1] + stride / 2) * cw + 46, 84 + 48 + 44, "tokens shared", "tag")
    yb = 84 + len(starts) * 48 + 6
    svg.line([(x0, yb), (x0 + room * cw - 3, yb)], arrow=False)
    svg.text(x0 + room * cw / 2, yb + 16, f"room = max_length − 2 = {room}", "shape", anchor="middle")
    svg.text(x0 + room * cw + 40, yb + 16, f"step = room − stride = {step}: where the next window starts", "shape")
    svg.text(10, yb + 46, "Each window goes through BERT alone: one vector per window. The post's vector pools them "
             "(mean, max", "small")
    svg.text(10, yb + 64, "or attention) before the classifier: bertlib.data.windows.split_windows, "
             "bertlib.data.windows.pool_windows.", "small")
    return svg


# ------------------------------------------------------------------------- relative distances (ch. 13)

def relative_distance_table() -> Svg:
    """Chapter 13: the distance i - j of every query/key pair indexes one shared table of 2P - 1 rows."""
    t, big_p = 5, 5
    svg = Svg(800, 370, "Relative positions: every query-key pair reads the row of its distance in one table",
              f"Left: the distances i - j for a sequence of {t} tokens, query token i in the rows and key token j in "
              "the columns, from -4 to 4; every cell on one diagonal has the same distance. Right: the learned "
              f"table distance_embedding has 2P - 1 rows (here P = {big_p}, so 9 rows, numbered 0 to 8), each of "
              "head size d. The pair (i, j) reads row i - j + P - 1: distance 0 reads the middle row P - 1, "
              "distance -4 row 0 and distance 4 row 2P - 2. With relative_key (Shaw et al.) the score of (i, j) "
              "gains q_i times that row; relative_key_query (Huang et al.) adds k_j times the same row too. A "
              "sequence longer than P would need a row the table does not have.")
    cs, gx, gy = 40, 70, 70

    def fill(dist: int) -> str:               # one hue for keys on the left, another for the right, darker further
        hue = HEAD_COLOURS[2] if dist > 0 else HEAD_COLOURS[0]
        return f"fill: {hue}; fill-opacity: {0.06 + 0.11 * abs(dist):.2f}"

    svg.text(gx + t * cs / 2, 30, "distance i − j", "title", anchor="middle")
    svg.text(gx + t * cs / 2, 50, "key token j →", "small", anchor="middle")
    svg.text(gx - 36, gy + t * cs / 2, "query token i →", "small", anchor="middle", rotate=True)
    ei, ej = 4, 2                               # the example pair, and the row it reads
    er = ei - ej + big_p - 1
    for j in range(t):
        svg.text(gx + j * cs + cs / 2, gy - 4, str(j), "tag", anchor="middle")
    for i in range(t):
        svg.text(gx - 8, gy + i * cs + cs / 2 + 4, str(i), "tag", anchor="end")
        for j in range(t):
            svg.rect(gx + j * cs, gy + i * cs, cs - 2, cs - 2, "box", rx=2, style=fill(i - j))
            svg.text(gx + j * cs + cs / 2 - 1, gy + i * cs + cs / 2 + 4, f"{i - j:+d}" if i != j else "0", "code",
                     anchor="middle")
    svg.rect(gx + ej * cs - 2, gy + ei * cs - 2, cs + 2, cs + 2, "callout-line", rx=3)
    # the table
    tx, ty, rh = 470, 46, 28
    svg.text(tx + 60, 30, "distance_embedding", "code", anchor="middle")
    for r in range(2 * big_p - 1):
        dist = r - (big_p - 1)
        svg.rect(tx, ty + r * rh, 120, rh - 3, "box", rx=2, style=fill(dist))
        svg.text(tx + 60, ty + r * rh + 17, f"row {r}: i − j = {dist:+d}" if dist else f"row {r}: i − j = 0",
                 "small", anchor="middle")
    svg.rect(tx - 2, ty + er * rh - 2, 124, rh + 1, "callout-line", rx=3)
    svg.text(tx + 130, ty + (big_p - 1) * rh + 17, f"← row P − 1 (here P = {big_p})", "tag")
    svg.text(tx + 130, ty + er * rh + 17, f"← pair ({ei}, {ej}): {ei} − {ej} + {big_p - 1} = {er}", "tag")
    svg.line([(gx + ej * cs + cs / 2, gy + t * cs), (gx + ej * cs + cs / 2, gy + t * cs + 12),
              (tx - 24, gy + t * cs + 12), (tx - 24, ty + er * rh + 12), (tx - 4, ty + er * rh + 12)],
             cls="callout-line")
    svg.text(10, 322, "Pair (i, j) reads row i − j + P − 1: one row of head size d per distance, shared by a whole "
             "diagonal.", "small")
    svg.text(10, 340, "relative_key (Shaw et al.): the score of (i, j) gains q_i · row; relative_key_query (Huang et "
             "al.)", "small")
    svg.text(10, 358, "adds k_j · row as well. Only 2P − 1 rows exist: a longer sequence has distances the table "
             "cannot index.", "small")
    return svg


# ----------------------------------------------------------------------------- a decoder's key/value cache

def kv_cache() -> Svg:
    """Generation with a causal decoder: each step computes the new token's q, k, v and reuses the cached K, V."""
    t = 4
    svg = Svg(720, 300, "A decoder's key/value cache: one new token per step, earlier keys and values reused",
              f"A causal decoder generating text, at step {t}. Tokens 0 to {t - 1} were processed in earlier steps; "
              f"their keys k_0 to k_{t - 1} and values v_0 to v_{t - 1} are kept in the cache. Step {t} computes "
              f"the query q_{t}, key k_{t} and value v_{t} of the new token {t} only, appends k_{t} and v_{t} to "
              f"the cache, scores q_{t} against every cached key k_0 to k_{t} (the causal mask allows no later "
              f"token, and there is none), and takes the softmax-weighted sum of v_0 to v_{t}. Each step costs "
              "work proportional to the tokens so far, instead of recomputing all of them. BERT is an encoder: it "
              "reads all its tokens at once, every token sees both sides, and it needs no cache.")
    x0, cw = 110, 62
    svg.text(10, 24, f"Generating token by token, step {t}: only token {t} is new", "title")
    rows = [("tokens", [f"tok {j}" for j in range(t + 1)]), ("keys K", [f"k_{j}" for j in range(t + 1)]),
            ("values V", [f"v_{j}" for j in range(t + 1)])]
    for r, (name, cells) in enumerate(rows):
        y = 48 + r * 64
        svg.text(x0 - 12, y + 19, name, "small", anchor="end")
        for j, c in enumerate(cells):
            style = f"fill: {HIGHLIGHT}; fill-opacity: 0.3" if j == t else ""
            svg.rect(x0 + j * cw, y, cw - 6, 28, "box", rx=3, style=style)
            svg.text(x0 + j * cw + (cw - 6) / 2, y + 19, c, "code", anchor="middle")
        if r:
            svg.rect(x0 - 4, y - 4, t * cw + 2, 36, "frame", rx=4)
    svg.text(x0 + t * cw / 2, 232, f"the cache, kept from steps 0 to {t - 1}", "tag", anchor="middle")
    svg.text(x0 + t * cw + (cw - 6) / 2, 232, "new", "callout", anchor="middle")
    right = x0 + (t + 1) * cw - 6            # the rows' right end
    bx = right + 44
    _box(svg, bx, 40, 250, 44, [(f"token {t} only: q_{t}, k_{t}, v_{t} from h_{t}", "small"),
                                (f"k_{t}, v_{t} appended to the cache", "shape")])
    _box(svg, bx, 112, 250, 44, [(f"scores q_{t} · k_j / √d", "small"), (f"j = 0 … {t}: every cached key", "shape")])
    _box(svg, bx, 176, 250, 44, [(f"α_{t}j: softmax of the scores over j", "small"),
                                 (f"context_{t} = Σ_j α_{t}j v_j", "shape")])
    svg.line([(right + 2, 126), (bx - 2, 134)])
    svg.line([(right + 2, 190), (bx - 2, 198)])
    svg.line([(bx + 125, 84), (bx + 125, 110)])
    svg.line([(bx + 125, 156), (bx + 125, 174)])
    svg.text(10, 270, "Causal mask: token i attends to tokens j ≤ i only, so the keys and values of earlier tokens "
             "never change", "small")
    svg.text(10, 288, "and can be kept. BERT is an encoder: it reads all its tokens at once and needs no cache.",
             "small")
    return svg


# ------------------------------------------------------------------------------------------------- outputs

#: Figures drawn for chapters that may show them (issue 28 §4), with the chapter each one is for. A figure leaves
#: this list once a chapter shows it (tests/test_figures.py: every other figure must be shown somewhere).
OFFERED: dict[str, str] = {
    "post_ln_pre_ln.svg": "chapter 6: post-LN and pre-LN blocks",
    "sliding_windows.svg": "chapter 9b: windows with a stride over a long post",
}


def figures() -> dict[str, Callable[[], Svg]]:
    """File name -> the function that draws it."""
    out: dict[str, Callable[[], Svg]] = {"bert_architecture.svg": architecture}
    for chapter in CHAPTER_PARTS:
        out[f"bert_architecture_ch{chapter:02d}.svg"] = lambda c=chapter: architecture(c)
    out.update({"attention_head.svg": attention_head, "head_split.svg": head_split,
                "pipeline_stages.svg": pipeline_stages, "mlm_nsp_input.svg": mlm_nsp_input,
                "pretrain_finetune.svg": pretrain_finetune, "post_ln_pre_ln.svg": post_ln_pre_ln,
                "sliding_windows.svg": sliding_windows, "relative_distance.svg": relative_distance_table,
                "kv_cache.svg": kv_cache, "feed_forward.svg": feed_forward})
    return out


def render_all() -> dict[str, str]:
    """File name -> SVG text, exactly what :func:`main` writes."""
    return {name: draw().render() for name, draw in figures().items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write the SVGs into (default: figures/)")
    parser.add_argument("--list", action="store_true", help="print the file names and exit")
    args = parser.parse_args(argv)
    rendered = render_all()
    if args.list:
        print("\n".join(rendered))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (args.out / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(rendered)} SVGs to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
