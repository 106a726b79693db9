#!/usr/bin/env bash
# Ready for a GPU (issue #33, item 6): bench/gpu_check.py, at most 8 minutes on one H100.
#
#   bench/gpu_check.sh --prepare   # here, online: the wheels and the Qwen3 tokenizer,
#                                  # into $TURNSTILE_CACHE (default .cache/)
#   bench/gpu_check.sh             # on the GPU machine (no internet); carry
#                                  # .cache/gpu-wheels and .cache/tokenizers/qwen3-3.7.2
#   bench/gpu_check.sh --dry-run   # CPU, gloo, fp32, tiny shapes (tests/test_gpu_check.py)
#
# Prints the weight push's time between two processes on the one GPU (CUDA IPC), and
# DeepSpeed's bf16 step of a randomly initialised Qwen3-0.6B-shaped model against a
# bare PyTorch step: tokens/s of each and the ratio. Extra arguments go to gpu_check.py
# (e.g. --out figures.json). Env: PYTHON (default python3), TURNSTILE_CACHE.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
export TURNSTILE_CACHE=${TURNSTILE_CACHE:-$PWD/.cache}
WHEELS=$TURNSTILE_CACHE/gpu-wheels

if [[ "${1:-}" == --prepare ]]; then
    # deepspeed is published as a source archive: build its (pure-Python) wheel here;
    # pydantic-core is compiled: take the build for the GPU machine's CPython 3.12
    rm -rf "$WHEELS"
    grep -v '^pydantic-core' bench/gpu_requirements.txt >"$WHEELS.pure"
    "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" -r "$WHEELS.pure"
    rm "$WHEELS.pure"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_17_x86_64 -d "$WHEELS" \
        "$(grep '^pydantic-core' bench/gpu_requirements.txt)"
    "$PYTHON" tests/fetch_tokenizers.py
    du -sh "$WHEELS" "$TURNSTILE_CACHE"/tokenizers/qwen3-*
    exit 0
fi

if ! "$PYTHON" -c "import deepspeed" 2>/dev/null; then
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    "$PYTHON" -m pip install -q --no-index --no-deps --find-links "$WHEELS" --target "$site" \
        -r bench/gpu_requirements.txt
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export DS_BUILD_OPS=0 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
timeout 480 "$PYTHON" -m bench.gpu_check "$@"
