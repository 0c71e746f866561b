# The two commands a new user runs: `make serve` and `make test`. Each sets up what it needs.
VENV ?= .venv
BUILD ?= cpu
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(BUILD)-$(shell cat pyproject.toml Makefile scripts/install.sh | cksum | cut -d' ' -f1)
CONFIG ?= deployments/local.yaml
TINY_MODELS := tiny-llama tiny-llama3 tiny-sentencepiece
# The tiny models and the embedded model, and their LoRA adapters (rank 8 and 16).
TEST_MODELS := $(TINY_MODELS) tiny-llama-sibling smollm2-135m-instruct \
  $(foreach model,$(TINY_MODELS) smollm2-135m-instruct,$(model)-lora-r8 $(model)-lora-r16)
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: venv serve test unit screenshots prepare clean servers gpu-smoke

venv: $(STAMP)

$(STAMP):
	@echo "== setting up $(VENV) (about a minute and a half the first time)"
	test -x $(PY) || python3 -m venv $(VENV)
	# The same install step as the container images (docker/): CPU build unless BUILD=gpu, with
	# the test tools.
	scripts/install.sh $(PY) $(BUILD) test
	rm -f $(VENV)/.installed-* && touch $(STAMP)

serve: venv
	# The embedded model, and its test adapter that docs/api.md's examples load.
	$(VENV)/bin/probserve models prepare smollm2-135m-instruct smollm2-135m-instruct-lora-r8
	$(VENV)/bin/probserve serve --config $(CONFIG)

# The servers the tests run for real (each test session starts and stops its own):
# Prometheus (and promtool), Redis and headless Chromium with its WebDriver (the viewer's
# browser tests), from Debian's packages.
SERVERS := prometheus promtool redis-server chromium chromedriver
servers:
	@missing=$$(for binary in $(SERVERS); do command -v $$binary >/dev/null || echo $$binary; done); \
	[ -z "$$missing" ] || { \
	  echo "== installing Debian's packages for: $$missing"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends \
	    prometheus redis-server chromium chromium-driver; }

test: venv servers
	$(VENV)/bin/ruff check serve_app tests bench
	$(VENV)/bin/probserve models prepare $(TEST_MODELS)
	$(PY) -m pytest tests --durations=60

unit: venv
	$(PY) -m pytest tests -m "not e2e"

# The documentation's screenshots of the viewer (docs/images), taken by its tests.
screenshots: venv servers
	$(VENV)/bin/probserve models prepare $(TEST_MODELS)
	PROBSERVE_SCREENSHOTS=docs $(PY) -m pytest tests/e2e/test_viewer.py \
	  tests/e2e/test_tenancy.py::test_the_viewer_asks_for_a_key_and_shows_the_tenant_s_refusals

# The GPU smoke test (bench/gpu_smoke.py, docs/operations.md "Running on GPUs"): with NVIDIA
# GPUs, in a venv of the CUDA build (.venv-gpu), the model split across them where there are
# several (GPUS=1 keeps it on one); without one, its CPU mode in .venv.
GPU_BUILD := $(if $(shell nvidia-smi -L 2>/dev/null),gpu,cpu)
SMOKE_VENV := $(if $(filter gpu,$(GPU_BUILD)),.venv-gpu,$(VENV))
gpu-smoke:
	$(MAKE) venv VENV=$(SMOKE_VENV) BUILD=$(GPU_BUILD)
	$(SMOKE_VENV)/bin/probserve models prepare smollm2-135m-instruct
	PYTHONPATH=$(CURDIR) $(SMOKE_VENV)/bin/python bench/gpu_smoke.py $(if $(GPUS),--gpus $(GPUS))

clean:
	rm -rf $(VENV) .venv-gpu
