# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean

# torch is pinned and installed first so pip never pulls a multi-GB CUDA build for the package's torch>=2.5.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/attnkit train --preset tiny --minutes 3 --samples --run-dir runs/demo --overwrite
	$(VENV)/bin/attnkit report runs/demo --text "def forward(self, x): return self.attention(x) + x"

test: $(STAMP)
	@sh scripts/install-test-browser.sh
	$(PY) -m pytest -n 2 -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
