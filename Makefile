# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean

# torch is pinned and installed first, so the package's torch>=2.5 is already met when attnkit is installed.
# Where it comes from: on a machine without an NVIDIA GPU (no nvidia-smi) the PyTorch CPU wheel index, because
# PyPI's Linux torch is the CUDA build (with its nvidia-* libraries); with a GPU, pip's own configuration.
# Override: make TORCH_INDEX=https://download.pytorch.org/whl/cu126 (any index), or TORCH_INDEX= (pip's own
# configuration: PyPI, a mirror, a local wheel folder). An unreachable index falls back to pip's configuration.
TORCH_VERSION   ?= 2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX     ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,$(TORCH_CPU_INDEX))

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	sh scripts/install-torch.sh $(PY) $(TORCH_VERSION) "$(TORCH_INDEX)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	@echo "make demo: 3 minutes of training (the run ends at its deadline, start-up included), then the HTML report (seconds)"
	$(VENV)/bin/attnkit train --preset tiny --minutes 3 --samples --run-dir runs/demo --overwrite
	$(VENV)/bin/attnkit report runs/demo --text "def forward(self, x): return self.attention(x) + x"

test: $(STAMP)
	@sh scripts/install-test-browser.sh
	@sh scripts/install-test-postgres.sh
	$(PY) -m pytest -n 2 -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
