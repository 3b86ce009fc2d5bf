"""Each chapter page states the run time and peak memory its notebook took when the book was built.

Nothing is typed by hand: the run time is jupyter-cache's execution time (myst-nb's ``exec_data``), and the peak
memory is written by the notebook's own kernel. The build points ``IPYTHONDIR`` at a profile whose startup file
(``kernel_startup.py``) records ``ru_maxrss`` (and the peak CUDA allocation on a GPU) after every cell into
``$BERTBOOK_MEASURE_FILE``, which ``source-read`` sets to a per-notebook path just before myst-nb executes it.

A notebook taken from the execution cache is not re-run: its recorded figures are reused when they belong to that
same execution (same run time), else the page says the memory was not measured by this build. Every figure is
also written to ``_build/measurements.json``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

ENV_VAR = "BERTBOOK_MEASURE_FILE"


def state_dir(build_dir: Path) -> Path:
    """Where the measurements and the kernels' IPython profile live: ``_build/.bertbook``."""
    return Path(build_dir) / ".bertbook"


def _state_dir(app: Sphinx) -> Path:
    return state_dir(Path(app.outdir).parent)


def record_path(state: Path, docname: str, pending: bool) -> Path:
    """The measurement file of ``docname`` (e.g. ``chapters/01_tokenization``): pending while its kernel runs."""
    name = docname.replace("/", "__") + (".pending.json" if pending else ".json")
    return state / "measurements" / name


def _record_path(app: Sphinx, docname: str, pending: bool) -> Path:
    return record_path(_state_dir(app), docname, pending)


def install_startup(state: Path) -> Path:
    """An IPython profile whose startup file measures each kernel; returns the directory for ``IPYTHONDIR``.
    Used by the build and by the nbval run that fills the book's execution cache (tests/nbval_book_cache.py)."""
    ipython = state / "ipython"
    startup = ipython / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (state / "measurements").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("kernel_startup.py"), startup / "00-bertbook-measure.py")
    return ipython


def install_kernel_hook(app: Sphinx) -> None:
    """builder-inited: kernels started by this build inherit ``IPYTHONDIR`` and so measure themselves."""
    os.environ["IPYTHONDIR"] = str(install_startup(_state_dir(app)))
    if not hasattr(app.env, "bertbook_measured"):
        app.env.bertbook_measured = {}


def before_read(app: Sphinx, docname: str, source: list[str]) -> None:
    """source-read: the next kernel started (myst-nb executes while parsing this document) measures into a
    fresh per-document file."""
    pending = _record_path(app, docname, pending=True)
    pending.unlink(missing_ok=True)
    os.environ[ENV_VAR] = str(pending)


def _exec_data(app: Sphinx, docname: str) -> dict[str, Any] | None:
    try:
        from myst_nb.sphinx_ import NbMetadataCollector

        return NbMetadataCollector.get_exec_data(app.env, docname)
    except (ImportError, KeyError):
        return None


def _mib(x: float) -> str:
    return f"{x / 1024:.2f} GiB" if x >= 1024 else f"{x:.0f} MiB"


def describe(record: dict[str, Any]) -> tuple[str, str]:
    """The two sentences a chapter page shows its reader: what running the page cost when the book was built, and
    what changes on a GPU. Written for the reader (no build commands, no test tools); ``executed_by`` (the book
    build or the ``make test`` run that filled its cache) stays in ``_build/measurements.json``."""
    runtime = record.get("runtime_s")
    gpu = ("On a GPU: with CUDA present (or `BERTLIB_DEVICE=cuda`) the chapter runs there and defaults to the "
           "`full` profile (all the data, sequences up to 512 tokens; `BERTLIB_PROFILE=quick` keeps the CPU "
           "workload). TF32 stays off, so the float32 checks hold with the same tolerance. A book built on a GPU "
           "gives that run's time here, and its peak GPU memory.")
    profile = f"the {record['profile']} profile" if record.get("profile") else "its default profile"
    if record.get("gpu"):
        device = f"a GPU ({record['gpu']})"
    elif record.get("device"):
        device = "the CPU" if record["device"] == "cpu" else record["device"]
    else:
        device = "an unrecorded device"
    machine = []
    if record.get("cpu_count"):
        machine.append(f"{record['cpu_count']} CPU cores ({record.get('cpu_model', '?')})")
    if threads := record.get("torch_threads"):
        machine.append(f"{threads} torch thread{'' if threads == 1 else 's'}")
    machine += [f"{name} {record[k]}" for k, name in (("python", "Python"), ("torch", "torch"),
                                                      ("transformers", "transformers")) if record.get(k)]
    if record.get("peak_rss_mib") is not None:
        memory = f"a peak memory of {_mib(record['peak_rss_mib'])}"
        if record.get("cuda_peak_allocated_mib") is not None:
            memory += f" (and {_mib(record['cuda_peak_allocated_mib'])} of GPU memory at most)"
    else:
        memory = "no memory figure was recorded for that run"
    took = f"{runtime:.1f} s" if isinstance(runtime, (int, float)) else "an unrecorded time"
    if record.get("peak_rss_mib") is None:
        measured = (f"The outputs on this page come from an earlier build of the book, in which its code ran in "
                    f"{took} (starting Python included); {memory}.")
        return measured, gpu
    measured = (f"This page was executed when the book was built: its code ran in {took} (starting Python "
                f"included) in {profile} on {device}, with {memory}. The machine: "
                + ", ".join(machine or ["not recorded"]) + ".")
    return measured, gpu


def _paragraph(text: str) -> nodes.paragraph:
    """A paragraph in which `backquoted` parts are inline code."""
    para = nodes.paragraph()
    for i, part in enumerate(text.split("`")):
        if part:
            para += nodes.literal(text=part) if i % 2 else nodes.Text(part)
    return para


def after_read(app: Sphinx, doctree: nodes.document) -> None:
    """doctree-read: attach the measurement to the executed notebook's page, at the end of its content (after the
    exercises): the page opens with the chapter, not with the build's bookkeeping."""
    docname = app.env.docname
    os.environ.pop(ENV_VAR, None)
    exec_data = _exec_data(app, docname)
    pending, final = _record_path(app, docname, True), _record_path(app, docname, False)
    if not exec_data or exec_data.get("runtime") is None:
        pending.unlink(missing_ok=True)
        return
    record: dict[str, Any] = {}
    executed_now = pending.exists()
    if executed_now:  # executed by this build
        record = json.loads(pending.read_text())
        record["runtime_s"] = exec_data["runtime"]
        final.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        pending.unlink()
    elif final.exists():  # from the cache: keep the record only if it is of that same execution
        old = json.loads(final.read_text())
        if old.get("runtime_s") == exec_data["runtime"]:
            record = old
    record.setdefault("runtime_s", exec_data["runtime"])
    record["executed_by_this_build"] = executed_now
    app.env.bertbook_measured[docname] = record

    measured, gpu = describe(record)
    box = nodes.admonition(classes=["bertbook-measured"])
    box += nodes.title(text="What running this page cost")
    box += _paragraph(measured)
    box += _paragraph(gpu)
    section = doctree.next_node(nodes.section)
    (doctree if section is None else section).append(box)


def purge(app: Sphinx, env: Any, docname: str) -> None:
    getattr(env, "bertbook_measured", {}).pop(docname, None)


def merge(app: Sphinx, env: Any, docnames: set[str], other: Any) -> None:
    env.bertbook_measured = getattr(env, "bertbook_measured", {})
    env.bertbook_measured.update({d: r for d, r in getattr(other, "bertbook_measured", {}).items() if d in docnames})


def write_summary(app: Sphinx, exception: Exception | None) -> None:
    """build-finished: every chapter's figures in ``_build/measurements.json`` and the build log."""
    if exception is not None:
        return
    measured = dict(sorted(getattr(app.env, "bertbook_measured", {}).items()))
    if not measured:
        return
    (Path(app.outdir).parent / "measurements.json").write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
    for docname, r in measured.items():
        mem = f"{r['peak_rss_mib']:.0f} MiB" if r.get("peak_rss_mib") is not None else "not measured"
        logger.info(f"bertbook: {docname}: {r.get('runtime_s', float('nan')):.1f} s, peak memory {mem}")
