"""The self-check quizzes (quizzes/<chapter>.json, shown by bertlib.course.quiz): every chapter has one, each is well
formed, and each chapter shows its own quiz at its end. Read from files only, apart from rendering the HTML (no kernel).
The quizzes clicked in a browser: tests/browser/test_book_in_browser.py::test_self_check_quiz_gives_feedback_offline.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from bertlib.course import quiz as bq
from toc import ROOT, notebooks

CHAPTERS = [p for p in notebooks() if p.parent.name == "chapters"]
QUIZZES = sorted((ROOT / "quizzes").glob("*.json"))
#: Chapters whose quiz is written after the chapter itself (listed here with the reason, never silently).
PENDING: dict[str, str] = {}
QUIZ_CALL = re.compile(r"""quiz\(\s*["'](\d+[a-z]?)["']\s*\)""")


def _number(path: Path) -> str:
    """'04_attention_head.ipynb' -> '04', '09b_long_documents.ipynb' -> '09b'."""
    return path.stem.split("_", 1)[0]


def _questions(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_chapter_has_a_quiz_and_every_quiz_a_chapter():
    chapters = {_number(p) for p in CHAPTERS}
    quizzes = {p.stem for p in QUIZZES}
    missing = sorted(chapters - quizzes - set(PENDING))
    assert not missing, f"chapters in _toc.yml without quizzes/<chapter>.json: {missing}"
    orphans = sorted(quizzes - chapters)
    assert not orphans, f"quizzes for no chapter in _toc.yml: {orphans}"


@pytest.mark.parametrize("path", QUIZZES, ids=lambda p: p.stem)
def test_quiz_is_well_formed(path: Path):
    questions = _questions(path)
    assert isinstance(questions, list) and 3 <= len(questions) <= 5, f"{path.name}: want 3 to 5 questions"
    for n, q in enumerate(questions, 1):
        where = f"{path.name}, question {n}"
        assert q["type"] == "multiple_choice" and q["question"].strip(), where
        answers = q["answers"]
        assert len(answers) >= 3, f"{where}: fewer than 3 options"
        assert [a["correct"] for a in answers].count(True) == 1, f"{where}: not exactly one correct option"
        assert all(isinstance(a["correct"], bool) for a in answers), f"{where}: 'correct' must be true or false"
        for a in answers:
            assert a["answer"].strip(), f"{where}: an option without text"
            assert len(a["feedback"].split()) >= 4, f"{where}: option {a['answer']!r} has no explanation"
        assert len({a["answer"] for a in answers}) == len(answers), f"{where}: two options with the same text"
        assert len({a["feedback"] for a in answers}) == len(answers), f"{where}: two options share one explanation"
    assert bq.problems(questions) == [], bq.problems(questions)


def test_the_validator_rejects_broken_quizzes():
    """bertlib.course.quiz.problems (which bertlib.course.quiz.load applies) on small broken examples."""
    good = _questions(QUIZZES[0])
    assert bq.problems(good) == []
    two_right = json.loads(json.dumps(good))
    two_right[0]["answers"][1]["correct"] = two_right[0]["answers"][0]["correct"] = True
    no_feedback = json.loads(json.dumps(good))
    no_feedback[0]["answers"][2]["feedback"] = ""
    maths = json.loads(json.dumps(good))
    maths[0]["question"] += " $x$"
    for broken in (good[:2], good * 2, two_right, no_feedback, maths, {"question": "?"}):
        assert bq.problems(broken), broken


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_ends_with_its_quiz(path: Path):
    number = _number(path)
    if number in PENDING:
        pytest.skip(f"{path.name}: quiz pending ({PENDING[number]})")
    cells = nbformat.read(path, as_version=4).cells
    heading = [i for i, c in enumerate(cells)
               if c.cell_type == "markdown" and c.source.startswith("## Self-check quiz")]
    assert heading, f"{path.name}: no '## Self-check quiz' section"
    calls = [(i, m.group(1)) for i, c in enumerate(cells) if c.cell_type == "code"
             for m in QUIZ_CALL.finditer(c.source)]
    assert [n for _, n in calls] == [number], f"{path.name}: shows quizzes {[n for _, n in calls]}, want [{number!r}]"
    assert calls[0][0] > heading[-1], f"{path.name}: the quiz cell comes before its heading"
    after = [c for c in cells[calls[0][0] + 1:] if c.cell_type == "code"]
    assert not after, f"{path.name}: code cells after the quiz (it closes the chapter)"


@pytest.mark.parametrize("path", QUIZZES, ids=lambda p: p.stem)
def test_quiz_html_is_self_contained(path: Path):
    """One text/html fragment: the questions and jupyterquiz's script inline, nothing fetched from anywhere."""
    from bertbook.offline import external_resources

    page = bq.quiz_html(path.stem)
    assert page.count("<script") == 1 and "src=" not in page.split("<script", 1)[1].split(">", 1)[0]
    assert external_resources(page) == []
    assert not re.search(r"https?://", page), re.findall(r"https?://\S{0,60}", page)
    assert "(function (MathJax) {" in page and page.rstrip().endswith("</script></div>")
    for q in _questions(path):  # every question and explanation is in the page, as HTML
        shown = bq.for_display([q])[0]
        assert json.dumps(shown["question"]) in page
        assert all(json.dumps(a["feedback"]) in page for a in shown["answers"])


def test_inline_code_and_escaping():
    assert bq._inline_markup("`a < b` & c") == "<code>a &lt; b</code> &amp; c"
