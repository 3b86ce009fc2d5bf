"""Self-check quizzes at the end of each chapter: ``from bertlib.course.quiz import quiz; quiz("04")``.

The questions are data, one file per chapter: ``quizzes/<chapter>.json`` (the chapter's number as its file name
starts: ``01``, ``01b``, ``09b``, ...), in jupyterquiz's format, so ``jupyterquiz.display_quiz(path)`` reads them
too. Each question is ``{"question": str, "type": "multiple_choice", "answers": [{"answer": str, "correct": bool,
"feedback": str}, ...]}`` with exactly one correct answer and a feedback (why it is right or wrong) on every one.
Text may use Markdown backticks for code; there is no maths (write √, ×, ≤ instead of ``$...$``).

jupyterquiz (PyPI, MIT) draws the quiz with JavaScript it ships inside the package. :func:`quiz_html` puts its
script, styles and the questions into one ``text/html`` output, so the quiz works wherever trusted HTML runs
its scripts: a live notebook (JupyterLab, Notebook 7, VS Code) and the HTML book, whose MyST-NB page embeds the
output. Nothing is fetched: the questions are inline, and jupyterquiz's one network path (loading MathJax 3 from a
CDN when a page has an incomplete MathJax) is switched off by running its script with ``MathJax`` undefined;
the quizzes hold no maths to typeset.
"""

from __future__ import annotations

import html
import json
import re
import secrets
from pathlib import Path
from typing import Any

from bertlib.data.files import project_path

#: Where the quiz files live: quizzes/ at the repository root (:func:`bertlib.data.files.project_path`).
QUIZ_DIR = project_path("quizzes")
MIN_QUESTIONS, MAX_QUESTIONS = 3, 5
_CDN = re.compile(r"https?://cdn\.jsdelivr\.net/npm/mathjax@[^'\"]*")


def quiz_path(chapter: str) -> Path:
    """``quizzes/<chapter>.json`` for a chapter number such as ``"04"`` or ``"09b"``."""
    if not QUIZ_DIR.is_dir():
        raise FileNotFoundError(f"no quizzes/ folder at {QUIZ_DIR}: the quizzes are files of the course's repository. "
                                "Run the notebook from a clone (chapters/, beside quizzes/).")
    return QUIZ_DIR / f"{chapter}.json"


def problems(questions: Any) -> list[str]:
    """What is wrong with a quiz's data (empty when it is valid)."""
    if not isinstance(questions, list):
        return ["a quiz is a JSON list of questions"]
    found = []
    if not MIN_QUESTIONS <= len(questions) <= MAX_QUESTIONS:
        found.append(f"{len(questions)} questions (want {MIN_QUESTIONS} to {MAX_QUESTIONS})")
    for i, q in enumerate(questions, 1):
        where = f"question {i}"
        if not isinstance(q, dict) or not str(q.get("question", "")).strip():
            found.append(f"{where}: no question text")
            continue
        if q.get("type") != "multiple_choice":
            found.append(f"{where}: type {q.get('type')!r}, not 'multiple_choice'")
        answers = q.get("answers")
        if not isinstance(answers, list) or len(answers) < 3:
            found.append(f"{where}: fewer than 3 options")
            continue
        if sum(a.get("correct") is True for a in answers) != 1:
            found.append(f"{where}: {sum(a.get('correct') is True for a in answers)} correct options (want 1)")
        for j, a in enumerate(answers, 1):
            if not str(a.get("answer", "")).strip():
                found.append(f"{where}, option {j}: no text")
            if not isinstance(a.get("correct"), bool):
                found.append(f"{where}, option {j}: 'correct' is not true or false")
            if len(str(a.get("feedback", "")).split()) < 4:
                found.append(f"{where}, option {j}: no explanation (feedback) of why it is right or wrong")
        texts = [q["question"]] + [str(a.get(k, "")) for a in answers for k in ("answer", "feedback")]
        if any("$" in t for t in texts):
            found.append(f"{where}: '$' (jupyterquiz would read it as maths, which the quizzes do not typeset)")
        if any(t.count("`") % 2 for t in texts):
            found.append(f"{where}: an unclosed backtick")
        options = [str(a.get("answer", "")).strip() for a in answers]
        if len(set(options)) != len(options):
            found.append(f"{where}: two options with the same text")
    return found


def load(chapter: str) -> list[dict[str, Any]]:
    """The questions of ``quizzes/<chapter>.json``, checked (ValueError says what is wrong)."""
    path = quiz_path(chapter)
    questions = json.loads(path.read_text(encoding="utf-8"))
    bad = problems(questions)
    if bad:
        raise ValueError(f"{path}: " + "; ".join(bad))
    return questions


def _inline_markup(text: str) -> str:
    """HTML-escape ``text`` and turn ```code``` into ``<code>code</code>`` (jupyterquiz sets it as innerHTML)."""
    parts = html.escape(text, quote=False).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def for_display(questions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The questions with their text as the HTML jupyterquiz shows."""
    out = []
    for q in questions:
        answers = [{**a, "answer": _inline_markup(a["answer"]), "feedback": _inline_markup(a["feedback"])}
                   for a in q["answers"]]
        out.append({**q, "question": _inline_markup(q["question"]), "answers": answers})
    return out


def quiz_html(chapter: str, *, shuffle_answers: bool = True) -> str:
    """One self-contained HTML fragment (a div, its styles, one inline script) that draws the chapter's quiz."""
    try:
        from jupyterquiz.dynamic.loader import load_questions_script
        from jupyterquiz.dynamic.renderer import build_script, build_styles, render_div
    except ImportError as err:
        raise ImportError("the self-check quizzes need jupyterquiz (the book extra): "
                          "pip install 'jupyterquiz>=2.9.6,<2.10'") from err

    questions = for_display(load(chapter))
    div_id = "quiz" + secrets.token_hex(6)
    prefix, static, url = load_questions_script(questions, div_id)
    div = render_div(div_id, False, shuffle_answers, False, 1_000_000, 720, 10, "left")
    colors = {"--jq-multiple-choice-bg": "#2f4b7c", "--jq-mc-button-bg": "#fafafa",
              "--jq-mc-button-border": "#d0d0d0", "--jq-mc-button-inset-shadow": "#555555",
              "--jq-incorrect-color": "#b00020", "--jq-correct-color": "#00752a", "--jq-text-color": "#fafafa",
              "--jq-link-color": "#cfe0ff"}
    styles = build_styles(div_id, colors)
    script = build_script(prefix, static, url, div_id, True)
    script = _CDN.sub("", script)  # the CDN fallback is unreachable below; leave no URL in the page either
    # jupyterquiz's code runs with MathJax undefined: no typesetting and no MathJax fetched from a CDN.
    script = f"(function (MathJax) {{\n{script}\n}})(undefined);"
    script = re.sub(r"</(script)", r"<\\/\1", script, flags=re.IGNORECASE)  # only inside JS strings here
    return (f'<div class="bertlib-quiz" data-chapter="{html.escape(chapter)}">{div}</div>{styles}'
            f"<script>\n{script}\n</script></div>")


def quiz(chapter: str) -> None:
    """Show the chapter's self-check quiz: click an option to see whether it is right and why."""
    from IPython.display import HTML, display

    display(HTML(quiz_html(chapter)))
