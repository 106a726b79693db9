#!/usr/bin/env bash
# Create one virtualenv per real client library, for tests/clients (their pins conflict:
# litellm needs openai<3, openai-agents openai>=3, camel-ai mcp<2).
#
#   tests/clients/setup_venvs.sh [NAME ...]     # default: every requirements/*.txt
#
# .venv-clients/<name>/ gets exactly requirements/<name>.txt. A stamp file named after the
# requirements' hash makes a re-run a no-op (~0.1 s); a changed file rebuilds that venv.
# The venvs have no pip of their own: the main venv's pip installs into them (--python),
# which keeps them smaller. The venvs install in parallel; logs go to .venv-clients/*.log.
# Env: MAIN_PYTHON (default .venv/bin/python), TURNSTILE_CLIENT_VENVS (default .venv-clients).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
MAIN_PYTHON="${MAIN_PYTHON:-$REPO/.venv/bin/python}"
DEST="${TURNSTILE_CLIENT_VENVS:-$REPO/.venv-clients}"

if [ ! -x "$MAIN_PYTHON" ]; then
    echo "setup_venvs.sh: $MAIN_PYTHON not found; run 'make setup' first" >&2
    exit 1
fi
if [ $# -gt 0 ]; then
    names=("$@")
else
    names=()
    for req in "$HERE"/requirements/*.txt; do
        names+=("$(basename "$req" .txt)")
    done
fi
mkdir -p "$DEST"

install_one() {
    local name="$1" req="$HERE/requirements/$1.txt" venv="$DEST/$1"
    local hash stamp start
    hash="$(sha1sum <"$req" | cut -c1-12)"
    stamp="$venv/.installed-$hash"
    if [ -f "$stamp" ] && [ -x "$venv/bin/python" ]; then
        echo "client venv $name: up to date"
        return 0
    fi
    start=$SECONDS
    rm -rf "$venv"
    "$MAIN_PYTHON" -m venv --without-pip "$venv"
    if ! "$MAIN_PYTHON" -m pip --python "$venv/bin/python" install -q \
        --disable-pip-version-check -r "$req" >"$DEST/$name.log" 2>&1; then
        echo "client venv $name: install FAILED, see $DEST/$name.log:" >&2
        grep -v "^WARNING: Location" "$DEST/$name.log" | tail -n 20 >&2
        return 1
    fi
    touch "$stamp"
    echo "client venv $name: installed in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))"
}

pids=()
for name in "${names[@]}"; do
    if [ ! -f "$HERE/requirements/$name.txt" ]; then
        echo "setup_venvs.sh: no requirements/$name.txt" >&2
        exit 1
    fi
    install_one "$name" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
exit $status
