# Two commands for a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and install edgecap with every extra that
# works on a CPU-only machine (ros2: rclpy wheels, for the live ROS 2 node tests).
# torch is installed first, pinned to the build that lies on disk (see
# constraints.txt), so pip never resolves another torch.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.edgecap-installed
PYTEST_ARGS ?=
# Foxglove's JavaScript MCAP readers for tests/test_ros_foxglove.py, pinned by package-lock.json;
# npm writes the stamp. Without npm the step says so and those tests skip.
JS       := tests/js
JS_STAMP := $(JS)/node_modules/.package-lock.json

.PHONY: demo test install js lint clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(PIP) install --quiet -c constraints.txt torch==2.14.1 torchvision==0.29.1
	$(PIP) install --quiet -c constraints.txt -e ".[train,nlp,eval,ros,ros2,rerun,coco,fleet,dev]"
	touch $(STAMP)

install: $(STAMP)

$(JS_STAMP): $(JS)/package.json $(JS)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd $(JS) && npm ci --prefer-offline --no-audit --no-fund --loglevel=error; \
	else echo "make: npm not found: tests/test_ros_foxglove.py (Foxglove's readers) will skip" >&2; fi

js: $(JS_STAMP)

demo: $(STAMP)
	$(VENV)/bin/edgecap demo

test: $(STAMP) $(JS_STAMP)
	@$(PY) -m pytest $(PYTEST_ARGS); code=$$?; \
	if [ $$code -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$code

lint: $(STAMP)
	$(VENV)/bin/ruff check edgecap tests benchmarks

clean-venv:
	rm -rf $(VENV)
