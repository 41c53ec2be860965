# Two commands for a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and install edgecap with every extra that
# works on a CPU-only machine. torch is installed first, pinned to the build
# that lies on disk (see constraints.txt), so pip never resolves another torch.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.edgecap-installed
PYTEST_ARGS ?=

.PHONY: demo test install lint clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(PIP) install --quiet -c constraints.txt torch==2.14.1 torchvision==0.29.1
	$(PIP) install --quiet -c constraints.txt -e ".[train,nlp,eval,ros,rerun,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/edgecap demo

test: $(STAMP)
	@$(PY) -m pytest $(PYTEST_ARGS); code=$$?; \
	if [ $$code -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$code

lint: $(STAMP)
	$(VENV)/bin/ruff check edgecap tests benchmarks

clean-venv:
	rm -rf $(VENV)
