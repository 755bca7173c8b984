# `make demo` and `make test` set everything up themselves (idempotent `setup`).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export WANDB_SILENT ?= true

.PHONY: setup browser demo test test-slow check-experiments check-experiments-quick bench lint clean

setup: $(STAMP) browser

# torch first, pinned: that takes the local CPU wheel; any later resolver then sees torch satisfied and
# never pulls a CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

# the browser test (tests/test_report_html.py) drives the system's Chromium through Playwright (Playwright's own
# browser download is not used): installed with apt-get where we are root and apt exists, else the test is skipped
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "note: no Chromium (apt-get install chromium): the browser test will be skipped"

demo: setup
	$(BIN)/python -m specnoise +experiment=quickstart
	# every drafter faithful and with decoder.auto=true, sized from this machine's own cost curve
	$(BIN)/python -m specnoise +experiment=hardware-aware-tiny decoder.cost_cache=outputs/cost_cache

test: setup
	$(BIN)/python -m pytest -n 2  # two workers: the CI machine has two cores, each test runs one torch thread

test-slow: setup
	$(BIN)/python -m pytest -m slow

# re-run every committed miniature (experiments/**/command.txt) and compare token and forward counts per row;
# JOBS=2 runs two at once (pytest-xdist; 0 = one after the other); -quick leaves out the ones that train first (`# check-minutes:` >= 20);
# TRAIN_CACHE=DIR: the trained-models folder of an earlier (interrupted) run, whose models are reused
JOBS ?= 0
TRAIN_CACHE ?=
check-experiments: setup
	$(BIN)/python -m pytest -m slow -n $(JOBS) $(if $(TRAIN_CACHE),--train-cache=$(TRAIN_CACHE)) tests/test_check_experiments.py

check-experiments-quick: setup
	$(BIN)/python -m pytest -m "slow and not long" -n $(JOBS) tests/test_check_experiments.py

bench: setup
	$(BIN)/python -m specnoise +experiment=bench-decoders

lint: setup
	$(BIN)/ruff check src tests

clean:
	rm -rf $(VENV) outputs/runs outputs/multirun
