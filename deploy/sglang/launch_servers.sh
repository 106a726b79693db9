#!/usr/bin/env bash
# One SGLang server per GPU (or per TP_SIZE GPUs), on ports BASE_PORT, BASE_PORT+1, ...
#
#   MODEL=/models/Qwen2.5-1.5B-Instruct deploy/sglang/launch_servers.sh
#
# Then put deploy/sglang/launch_router.sh in front of them, or give the gateway every
# server: turnstile serve --engine sglang --engine-url http://HOST:30001 --engine-url ...
# Runs in the foreground until interrupted; stops its servers on exit.
#
# Environment:
#   MODEL          local HF folder (or hub id) to serve; the gateway's --model must be
#                  the same model (it renders the chat template itself)
#   NUM_GPUS       GPUs to use (default: all that nvidia-smi lists)
#   TP_SIZE        GPUs per server, tensor parallel (default 1)
#   BASE_PORT      first port (default 30001; the router takes 30000)
#   HOST           address to bind (default 0.0.0.0)
#   MEM_FRACTION   --mem-fraction-static (default 0.85)
#   SGLANG_ARGS    more `python -m sglang.launch_server` flags, e.g. "--context-length 8192"
#   LOG_DIR        one log file per server (default logs/sglang)
#   PYTHON         interpreter with sglang installed (default python)
set -euo pipefail

MODEL=${MODEL:?set MODEL to the model folder (or hub id) to serve}
NUM_GPUS=${NUM_GPUS:-$(nvidia-smi -L | wc -l)}
TP_SIZE=${TP_SIZE:-1}
BASE_PORT=${BASE_PORT:-30001}
HOST=${HOST:-0.0.0.0}
MEM_FRACTION=${MEM_FRACTION:-0.85}
SGLANG_ARGS=${SGLANG_ARGS:-}
LOG_DIR=${LOG_DIR:-logs/sglang}
PYTHON=${PYTHON:-python}

if (( NUM_GPUS < TP_SIZE || NUM_GPUS % TP_SIZE != 0 )); then
    echo "NUM_GPUS ($NUM_GPUS) must be a multiple of TP_SIZE ($TP_SIZE)" >&2
    exit 2
fi
NUM_SERVERS=$(( NUM_GPUS / TP_SIZE ))
mkdir -p "$LOG_DIR"

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

for (( s = 0; s < NUM_SERVERS; s++ )); do
    port=$(( BASE_PORT + s ))
    first=$(( s * TP_SIZE ))
    gpus=$(seq -s, "$first" $(( first + TP_SIZE - 1 )))
    # shellcheck disable=SC2086  # SGLANG_ARGS is a list of flags
    CUDA_VISIBLE_DEVICES=$gpus "$PYTHON" -m sglang.launch_server \
        --model-path "$MODEL" \
        --host "$HOST" --port "$port" \
        --tp-size "$TP_SIZE" \
        --mem-fraction-static "$MEM_FRACTION" \
        $SGLANG_ARGS \
        >"$LOG_DIR/server-$port.log" 2>&1 &
    pids+=("$!")
    echo "server $s: GPUs $gpus, port $port, log $LOG_DIR/server-$port.log"
done

# Ready when every server answers /health (model loaded, warm-up request done).
for (( s = 0; s < NUM_SERVERS; s++ )); do
    port=$(( BASE_PORT + s ))
    until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
        if ! kill -0 "${pids[$s]}" 2>/dev/null; then
            echo "server on port $port exited; see $LOG_DIR/server-$port.log" >&2
            exit 1
        fi
        sleep 5
    done
done
urls=""
for (( s = 0; s < NUM_SERVERS; s++ )); do urls+="http://$(hostname):$(( BASE_PORT + s )) "; done
echo "ready: $urls"
wait -n "${pids[@]}"
echo "a server exited; stopping the others" >&2
exit 1
