"""Every page of the book, as a reader's browser renders it (see conftest.py for how this runs and skips).

For each page listed in _toc.yml: it loads with no console error, no uncaught exception, no failed request and no
request outside its own origin (they are blocked and recorded: the book must render offline); MathJax typeset
every equation; every image and plot is present; bertviz's head_view and model_view drew their SVG (the number of
attention lines is checked against the attention tensor embedded in the page) and the layer selector changes the
picture; wide views fit the content column or scroll inside their own box; every internal link and anchor
resolves; axe-core (from npm, injected into the page) finds no serious or critical WCAG 2 A/AA violation; each
chapter's self-check quiz answers a click on a wrong and on the right option with that option's
explanation (offline); and a full-page screenshot is kept in _build/screenshots/.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from toc import toc_files

from .book_browser import AXE, AXE_FAILING, AXE_TAGS, HTML, ROOT, SCREENSHOTS, Visit

DOCS = toc_files()
NOTEBOOKS = [d for d in DOCS if (ROOT / f"{d}.ipynb").exists()]

MATH_JS = """async () => {
  const nodes = [...document.querySelectorAll('.math')];
  if (!nodes.length) return {nodes: 0};
  if (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) return {nodes: nodes.length, loaded: false};
  await MathJax.startup.promise;
  const missing = nodes.filter(n => !n.querySelector('mjx-container'));
  const column = (document.querySelector('article.bd-article') || document.body).getBoundingClientRect();
  const cut = [...document.querySelectorAll('mjx-container[display="true"]')].filter(m => {
    const r = m.getBoundingClientRect();  // a display equation must fit the column or scroll in its own box
    const scrolls = ['auto', 'scroll'].includes(getComputedStyle(m).overflowX);
    return r.right > column.right + 1 && !scrolls;
  }).map(m => m.parentElement.textContent.slice(0, 80));
  return {nodes: nodes.length, loaded: true, version: MathJax.version, cut,
          typeset: nodes.length - missing.length, errors: document.querySelectorAll('mjx-merror').length,
          missing: missing.slice(0, 5).map(n => n.textContent.slice(0, 80))};
}"""

IMAGES_JS = """() => [...document.querySelectorAll('article img')].map(i => ({
  src: i.getAttribute('src'), complete: i.complete, width: i.naturalWidth, height: i.naturalHeight,
  output: !!i.closest('.cell_output')}))"""

BERTVIZ_JS = """() => {
  const column = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const col = column.getBoundingClientRect();
  return [...document.querySelectorAll('div[id^="bertviz-"]')].map(d => {
    const svg = d.querySelector('svg');
    const counts = {};
    if (svg) for (const e of svg.querySelectorAll('*')) counts[e.tagName] = (counts[e.tagName] || 0) + 1;
    let scroller = null;
    for (let e = d; e && e !== column; e = e.parentElement) {
      const cs = getComputedStyle(e);
      if (['auto', 'scroll'].includes(cs.overflowX) && e.scrollWidth > e.clientWidth + 1) {
        const r = e.getBoundingClientRect();
        scroller = {className: e.className, left: r.left, right: r.right, scrollWidth: e.scrollWidth,
                    clientWidth: e.clientWidth};
        break;
      }
    }
    const box = svg ? svg.getBoundingClientRect() : null;
    return {id: d.id, counts, selects: [...d.querySelectorAll('select')].map(s => s.id),
            svgWidth: box && box.width, fits: box ? box.left >= col.left - 1 && box.right <= col.right + 1 : null,
            scroller, column: [col.left, col.right]};
  });
}"""

SVG_STATE_JS = """(id) => {
  const svg = document.getElementById(id).querySelector('svg');
  const html = svg ? svg.innerHTML : '';
  let h = 0;
  for (let i = 0; i < html.length; i++) h = (h * 31 + html.charCodeAt(i)) | 0;
  return {hash: h, length: html.length, lines: svg ? svg.querySelectorAll('line').length : 0};
}"""

AXE_JS = """async (tags) => {
  const result = await axe.run(document, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']});
  return result.violations.map(v => ({id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl, tags: v.tags,
    count: v.nodes.length, nodes: v.nodes.slice(0, 5).map(n => ({target: n.target.join(' '),
                                                                html: n.html.slice(0, 200)}))}));
}"""

FEATURES_JS = """() => ({
  prev: !!document.querySelector('.prev-next-area a.left-prev'),
  next: !!document.querySelector('.prev-next-area a.right-next'),
  toc: document.querySelectorAll('nav.bd-links a.reference').length,
  search: !!document.querySelector('form.bd-search, .search-button, input[name="q"]'),
  launch: [...document.querySelectorAll('a[href*="colab.research.google.com"], a[href*="mybinder.org"]')]
    .map(a => a.href),
  download: [...document.querySelectorAll('a[href$=".ipynb"], a[href$=".md"]')].map(a => a.getAttribute('href')),
  measured: (document.querySelector('.bertbook-measured') || {}).innerText || null,
  caption_numbers: [...document.querySelectorAll('.caption-number')].map(e => e.textContent).slice(0, 5),
})"""


def _shot_name(docname: str) -> str:
    return docname.replace("/", "__")


def _bertviz_params(docname: str) -> dict[str, dict[str, Any]]:
    """root_div_id -> the parameters bertviz embedded in the page (its attention tensors and options)."""
    text = (HTML / f"{docname}.html").read_text(encoding="utf-8")
    decoder, found = json.JSONDecoder(), {}
    for m in re.finditer(r"const params = ", text):
        try:
            params, _ = decoder.raw_decode(text, m.end())
        except json.JSONDecodeError:  # neuron_view writes a JS object literal, not JSON
            continue
        if isinstance(params, dict) and "root_div_id" in params:
            found[params["root_div_id"]] = params
    return found


@pytest.fixture(scope="session")
def visits(site: str, browser: Any):
    """Every visited page; afterwards a summary beside the screenshots (_build/screenshots/summary.json)."""
    found: dict[str, Visit] = {}
    yield found
    summary = {d: {"load_error": v.load_error, "equations": v.math.get("nodes", 0),
                   "typeset": v.math.get("typeset", 0), "images": len(v.images),
                   "bertviz": [{"id": b["id"], "selects": b["selects"], "svg_elements": b["counts"],
                                "svg_width": b["svgWidth"], "fits": b["fits"], "scrolls": bool(b["scroller"]),
                                "layer_change": b.get("layer_change")} for b in v.bertviz],
                   "external_requests": v.external, "console_errors": v.console_errors,
                   "page_errors": v.page_errors, "measured": v.measured, "axe_violations": v.axe,
                   "screenshot": v.screenshot.name if v.screenshot else None}
               for d, v in found.items()}
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    (SCREENSHOTS / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


@pytest.fixture
def visit(request: pytest.FixtureRequest, visits: dict[str, Visit], site: str, browser: Any) -> Visit:
    """Open the page once per session (later tests reuse what it recorded)."""
    docname = request.param
    if docname not in visits:
        visits[docname] = _visit(browser, site, docname)
    v = visits[docname]
    if v.load_error and request.node.originalname != "test_page_loads_offline_without_errors":
        pytest.fail(f"{docname} did not finish loading: {v.load_error}")
    return v


def _visit(browser: Any, site: str, docname: str) -> Visit:
    """Everything the tests need from one page, recorded once; a page that fails to load is recorded too."""
    v = Visit(docname=docname, url=f"{site}/{docname}.html")
    page = browser.new_page()
    try:
        _record(page, site, v)
    except Exception as exc:  # noqa: BLE001 (a timeout or a script error: every test of the page reports it)
        v.load_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        page.close()
    return v


def _record(page: Any, site: str, v: Visit) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    docname = v.docname

    def route(r: Any) -> None:
        if r.request.url.startswith(site + "/") or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            v.external.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: v.console_errors.append(f"{m.text} ({m.location.get('url', '')})")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: v.page_errors.append(str(e)))
    page.on("requestfailed", lambda r: v.failed.append(f"{r.url}: {r.failure}")
            if r.url.startswith(site) else None)
    page.on("response", lambda r: v.bad_status.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    response = page.goto(v.url, wait_until="load", timeout=30_000)
    if response is None or response.status >= 400:
        v.load_error = f"HTTP {response.status if response else 'no response'} for {v.url}"
        return
    v.math = page.evaluate(MATH_JS)
    if page.locator('div[id^="bertviz-"]').count():
        try:  # bertviz draws after require.js has fetched d3 and jQuery
            page.wait_for_function("""() => [...document.querySelectorAll('div[id^="bertviz-"]')]
                                        .every(d => d.querySelector('svg *'))""", timeout=30_000)
        except PlaywrightTimeout:
            pass  # recorded below as views with nothing drawn
    page.wait_for_load_state("networkidle", timeout=30_000)
    v.images = page.evaluate(IMAGES_JS)
    v.bertviz = page.evaluate(BERTVIZ_JS)
    for view in v.bertviz:  # the layer selector (head_view, neuron_view) must redraw the picture
        if "layer" not in view["selects"] or not view["counts"]:
            continue
        select = page.locator(f'#{view["id"]} select#layer')
        options = select.locator("option").evaluate_all("os => os.map(o => o.value)")
        before = page.evaluate(SVG_STATE_JS, view["id"])
        target = options[-1] if select.input_value() != options[-1] else options[0]
        select.select_option(target)
        try:  # until the view has redrawn (a new, non-empty picture), not a fixed pause that a slow machine outlasts
            page.wait_for_function(f"""([id, hash]) => {{
                                         const s = ({SVG_STATE_JS})(id);
                                         return s.hash !== hash && s.length > 0;
                                       }}""", arg=[view["id"], before["hash"]], timeout=10_000)
        except PlaywrightTimeout:
            pass  # recorded below: the picture did not change
        view["layer_change"] = {"options": len(options), "to": target, "before": before,
                                "after": page.evaluate(SVG_STATE_JS, view["id"])}
    # the accessibility check, on the page as drawn (bertviz views included): axe-core's own file, inlined (no
    # request), run on WCAG 2 A/AA rules
    page.add_script_tag(content=AXE.read_text(encoding="utf-8"))
    v.axe = page.evaluate(AXE_JS, list(AXE_TAGS))
    feats = page.evaluate(FEATURES_JS)
    v.measured = feats.pop("measured")
    v.features = feats
    v.features["quiz"] = _click_quiz(page) if page.locator(".bertlib-quiz").count() else None
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    v.screenshot = SCREENSHOTS / f"{_shot_name(docname)}.png"
    page.screenshot(path=str(v.screenshot), full_page=True)
    for i, view in enumerate(v.bertviz):  # each drawn view on its own, as the reader sees it (scroll box included)
        if view["counts"]:
            box = page.locator(f'#{view["id"]}').locator("xpath=ancestor::div[contains(@class, 'cell_output')][1]")
            box.screenshot(path=str(SCREENSHOTS / f"{_shot_name(docname)}__bertviz{i}.png"), timeout=10_000)


def _click_quiz(page: Any) -> dict[str, Any]:
    """The chapter's self-check quiz (bertlib.course.quiz) as a reader uses it: click a wrong option of the first
    question, then its right option, and record what the page showed after each click."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    quiz = page.locator(".bertlib-quiz").first
    try:  # jupyterquiz draws the questions from the page's inline script
        quiz.locator("label.MCButton").first.wait_for(timeout=10_000)
    except PlaywrightTimeout:
        return {"chapter": quiz.get_attribute("data-chapter"), "questions": 0}
    first = quiz.locator(".Quiz").first
    feedback = first.locator(".Feedback")
    seen: dict[str, Any] = {"chapter": quiz.get_attribute("data-chapter"), "questions": quiz.locator(".Quiz").count(),
                            "question": first.locator("[id^='quizQn']").inner_text()}
    for kind in ("false", "true"):
        option = first.locator(f'label.MCButton[data-correct="{kind}"]').first
        option.scroll_into_view_if_needed()
        option.click()
        seen[kind] = {"option": option.inner_text(), "option_class": option.get_attribute("class"),
                      "feedback": feedback.inner_text(), "feedback_class": feedback.get_attribute("class")}
    return seen


pages = pytest.mark.parametrize("visit", DOCS, indirect=True)
notebook_pages = pytest.mark.parametrize("visit", NOTEBOOKS, indirect=True)


# ----------------------------------------------------------------------------------------------- tests

@pages
def test_page_loads_offline_without_errors(visit: Visit):
    assert not visit.load_error, f"{visit.docname} did not finish loading: {visit.load_error}"
    assert not visit.external, f"{visit.docname} requested outside its origin (blocked): {visit.external}"
    assert not visit.failed, f"{visit.docname}: failed requests {visit.failed}"
    assert not visit.bad_status, f"{visit.docname}: HTTP errors {visit.bad_status}"
    assert not visit.page_errors, f"{visit.docname}: uncaught JavaScript errors {visit.page_errors}"
    assert not visit.console_errors, f"{visit.docname}: console errors {visit.console_errors}"


@pages
def test_equations_are_typeset(visit: Visit):
    math = visit.math
    if not math["nodes"]:
        pytest.skip(f"{visit.docname} has no equations")
    assert math["loaded"], f"{visit.docname} has {math['nodes']} equations but MathJax did not load"
    assert math["typeset"] == math["nodes"] and not math["errors"], \
        f"{visit.docname}: MathJax typeset {math['typeset']}/{math['nodes']} ({math['errors']} errors): " \
        f"{math['missing']}"
    assert not math["cut"], f"{visit.docname}: display equations cut off at the column edge: {math['cut']}"


@pages
def test_images_and_plots_are_present(visit: Visit):
    broken = [i["src"] for i in visit.images if not (i["complete"] and i["width"] > 0 and i["height"] > 0)]
    assert not broken, f"{visit.docname}: images that did not load: {broken}"
    executed = ROOT / "_build" / "jupyter_execute" / f"{visit.docname}.ipynb"
    if not executed.exists():
        executed = HTML.parent / "jupyter_execute" / f"{visit.docname}.ipynb"
    if executed.exists():
        nb = json.loads(executed.read_text())
        plots = sum(1 for c in nb["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
        shown = sum(1 for i in visit.images if i["output"])
        assert shown >= plots, f"{visit.docname}: the notebook made {plots} plots, the page shows {shown}"


def _views(visit: Visit) -> list[dict[str, Any]]:
    if not visit.bertviz:
        pytest.skip(f"{visit.docname} has no bertviz view")
    return visit.bertviz


def _kind(view: dict[str, Any], params: dict[str, Any] | None) -> str:
    if params and "include_heads" in params:
        return "model_view"
    if params and "heads" in params:
        return "head_view"
    return "neuron_view" if "att_head" in view["selects"] else "unknown"


@pages
def test_bertviz_views_drew_their_svg(visit: Visit):
    params = _bertviz_params(visit.docname)
    for view in _views(visit):
        p = params.get(view["id"])
        kind = _kind(view, p)
        assert view["counts"], f"{visit.docname}: bertviz {kind} {view['id']} drew nothing"
        if kind in ("head_view", "model_view"):
            att = p["attention"][int(p.get("default_filter") or 0)]
            left, right = len(att["left_text"]), len(att["right_text"])
            if kind == "head_view":  # every head of the shown layer: one line per (query, key) pair
                expected = len(att["attn"][0]) * left * right
            else:  # one thumbnail per shown (layer, head)
                expected = len(p["include_layers"]) * len(p["include_heads"]) * left * right
            assert view["counts"].get("line") == expected, \
                f"{visit.docname}: {kind} drew {view['counts'].get('line')} attention lines, expected {expected}"


@pages
def test_bertviz_layer_selector_changes_the_picture(visit: Visit):
    selectable = [v for v in _views(visit) if "layer_change" in v]
    if not selectable:
        pytest.skip(f"{visit.docname}: no bertviz view with a layer selector")
    for view in selectable:
        change = view["layer_change"]
        assert change["options"] > 1, f"{view['id']}: the layer selector offers {change['options']} layer(s)"
        assert change["after"]["hash"] != change["before"]["hash"], \
            f"{visit.docname}: choosing layer {change['to']} in {view['id']} did not change the picture"
        assert change["after"]["length"] > 0


@pages
def test_wide_views_fit_or_scroll_in_their_own_box(visit: Visit):
    for view in _views(visit):
        if view["fits"]:
            continue
        box = view["scroller"]
        left, right = view["column"]
        assert view["svgWidth"] is not None, f"{visit.docname}: {view['id']} has no SVG"
        assert box is not None, (f"{visit.docname}: {view['id']} is {view['svgWidth']:.0f} px wide and spills "
                                 f"out of the {right - left:.0f} px column with no scroll box")
        assert box["left"] >= left - 1 and box["right"] <= right + 1, \
            f"{visit.docname}: the scroll box of {view['id']} is wider than the column"


@pages
def test_no_serious_or_critical_accessibility_violations(visit: Visit):
    """axe-core, WCAG 2.0/2.1 A and AA: no violation of serious or critical impact (bertviz's controls included:
    the book names them, _ext/bertbook/accessibility.py). axe-core's experimental rules (which its default run
    leaves out) and milder violations are listed in summary.json, not failed."""
    assert visit.axe is not None, f"{visit.docname}: axe-core did not run"
    failing = [v for v in visit.axe if v["impact"] in AXE_FAILING and "experimental" not in v["tags"]]
    assert not failing, f"{visit.docname}: {len(failing)} serious or critical axe-core violations:\n" + "\n".join(
        f"  {v['impact']} {v['id']} ({v['count']} nodes): {v['help']} {v['helpUrl']}\n    "
        + "\n    ".join(f"{n['target']}: {n['html']}" for n in v["nodes"]) for v in failing)


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if a.get(key):
                self.ids.add(a[key])
        for key in ("href", "src"):
            if a.get(key) and (tag, key) in {("a", "href"), ("link", "href"), ("img", "src"), ("script", "src")}:
                self.links.append((tag, a[key]))


_parsed: dict[Path, _Anchors] = {}


def _parse(path: Path) -> _Anchors:
    if path not in _parsed:
        p = _Anchors()
        p.feed(path.read_text(encoding="utf-8", errors="replace"))
        _parsed[path] = p
    return _parsed[path]


@pytest.mark.parametrize("docname", DOCS)
def test_internal_links_and_anchors_resolve(docname: str):
    page = HTML / f"{docname}.html"
    assert page.exists(), f"{docname} is in _toc.yml but {page} was not built"
    broken = []
    for tag, link in _parse(page).links:
        parts = urlsplit(link)
        if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
            continue
        target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        if target.is_dir():
            target = target / "index.html"
        if not target.exists():
            broken.append(f"<{tag}> {link}: no file {target}")
            continue
        if parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _parse(target).ids:
            broken.append(f"<{tag}> {link}: no anchor #{parts.fragment} in {target.relative_to(HTML)}")
    assert not broken, f"{docname}: {len(broken)} broken links:\n" + "\n".join(broken[:20])


@pytest.mark.parametrize("docname", DOCS)
def test_printed_markdown_tables_are_tables(docname: str):
    """A table a cell prints with ``display(Markdown(...))`` (chapter 1's parameter table, chapter 9's results) is
    an HTML table: under MyST-NB's default CommonMark it was one paragraph of pipes (``nb_render_markdown_format``)."""
    page = (HTML / f"{docname}.html").read_text(encoding="utf-8", errors="replace")
    paragraphs = (re.sub(r"<[^>]+>", "", p).strip() for p in re.findall(r"<p>(.*?)</p>", page, re.S))
    raw = [p[:80] for p in paragraphs if p.startswith("|") and p.count("|") >= 4]
    assert not raw, f"{docname}: {len(raw)} table(s) printed as text: {raw}"


@pages
def test_screenshot_saved(visit: Visit):
    from struct import unpack

    data = visit.screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{visit.screenshot} is not a PNG"
    width, height = unpack(">II", data[16:24])
    assert width >= 800 and height >= 400, f"{visit.screenshot}: {width}x{height}"


@pages
def test_reader_features(visit: Visit):
    f = visit.features
    assert f["toc"] > 0 and f["search"], f"{visit.docname}: no table of contents or search box"
    # the chapters number their figures in the caption ("Figure 4.1"); Sphinx's own count stays off (bertbook)
    assert not f["caption_numbers"], f"{visit.docname}: Sphinx numbered captions {f['caption_numbers']}"
    index = DOCS.index(visit.docname)
    assert f["next"] == (index < len(DOCS) - 1), f"{visit.docname}: next link {'missing' if not f['next'] else 'extra'}"
    if visit.docname in NOTEBOOKS:
        name = Path(visit.docname).name
        assert any("colab.research.google.com" in u and name in u for u in f["launch"]), \
            f"{visit.docname}: no Colab launch button"
        assert any("mybinder.org" in u and name in u for u in f["launch"]), f"{visit.docname}: no Binder launch button"
        assert any(h.endswith(f"{name}.ipynb") for h in f["download"]), f"{visit.docname}: no notebook download"


@notebook_pages
def test_chapter_states_its_measured_run_time_and_memory(visit: Visit):
    text = visit.measured
    assert text, f"{visit.docname}: no 'What running this page cost' box (the bertbook extension adds it)"
    assert re.search(r"ran in \d+(\.\d+)? s", text), f"{visit.docname}: no run time in {text!r}"
    assert "On a GPU" in text, f"{visit.docname}: the box does not say what changes on a GPU"
    if "no memory figure" in text:
        pytest.xfail(f"{visit.docname}: outputs from an older execution cache, memory not recorded: {text[:200]}")
    assert re.search(r"peak memory of \d+(\.\d+)? (MiB|GiB)", text), f"{visit.docname}: no peak memory in {text!r}"


@notebook_pages
def test_self_check_quiz_gives_feedback_offline(visit: Visit):
    """The quiz is drawn (every question of quizzes/<chapter>.json), and a click on an option shows whether it is
    right and the explanation stored with that option; no request leaves the page's origin meanwhile."""
    number = Path(visit.docname).name.split("_", 1)[0]
    source = ROOT / "quizzes" / f"{number}.json"
    quiz = visit.features.get("quiz")
    if quiz is None:
        nb = json.loads((ROOT / f"{visit.docname}.ipynb").read_text())
        called = any(f'quiz("{number}")' in "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        assert not called, f"{visit.docname}: the notebook shows a quiz but the page has none"
        pytest.skip(f"{visit.docname}: no self-check quiz in this chapter")
    questions = json.loads(source.read_text())
    assert quiz["chapter"] == number and quiz["questions"] == len(questions), \
        f"{visit.docname}: quiz {quiz['chapter']} drew {quiz['questions']} questions, {source.name} {len(questions)}"

    def plain(text: str) -> str:  # the page shows `code` as <code>code</code>
        return " ".join(text.replace("`", "").split())

    answers = {plain(a["answer"]): a for a in questions[0]["answers"]}
    assert plain(quiz["question"]) == plain(questions[0]["question"]), quiz["question"]
    for kind, correct in (("false", False), ("true", True)):
        click = quiz[kind]
        answer = answers[plain(click["option"])]
        assert answer["correct"] is correct
        assert plain(click["feedback"]) == plain(answer["feedback"]), \
            f"{visit.docname}: clicking {click['option']!r} showed {click['feedback']!r}"
        state = "correct" if correct else "incorrect"
        assert state in click["feedback_class"].split() and f"{state}Button" in click["option_class"].split(), click
    assert not visit.external, f"{visit.docname}: requests outside the book: {visit.external}"


def test_search_finds_a_chapter(site: str, browser: Any):
    """Sphinx's client-side search works offline: searching 'attention' lists pages."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{site}/search.html?q=attention", wait_until="load")
    page.wait_for_function("() => document.querySelectorAll('#search-results li').length > 0", timeout=60_000)
    hits = page.locator("#search-results li").count()
    page.close()
    assert hits > 0 and not errors, f"search: {hits} hits, errors {errors}"
