#!/usr/bin/env bash
# sglang-router in front of the SGLang servers: one URL for the gateway.
#
#   WORKER_URLS="http://gpu1:30001 http://gpu1:30002" deploy/sglang/launch_router.sh
#   turnstile serve --engine sglang --engine-url http://ROUTER_HOST:30000 ...
#
# The gateway sends each session's id as the X-SMG-Routing-Key header: with
# POLICY=manual or consistent_hashing (recent sglang-router releases) a session stays
# on one worker, where its prefix is cached; cache_aware (the default everywhere)
# gets most of that from prefix matching. Weight updates do not go through the
# router: the gateway asks it for its workers (GET /list_workers) and pauses, loads
# and resumes each of them itself.
#
# Environment:
#   WORKER_URLS   space-separated server URLs (default: NUM_SERVERS servers on this
#                 host from BASE_PORT, as launch_servers.sh starts them)
#   NUM_SERVERS   default: GPUs that nvidia-smi lists
#   BASE_PORT     default 30001
#   ROUTER_PORT   default 30000
#   POLICY        cache_aware | manual | consistent_hashing | round_robin | ...
#   ROUTER_ARGS   more `python -m sglang_router.launch_router` flags
#   PYTHON        interpreter with sglang-router installed (pip install sglang-router)
set -euo pipefail

BASE_PORT=${BASE_PORT:-30001}
ROUTER_PORT=${ROUTER_PORT:-30000}
POLICY=${POLICY:-cache_aware}
ROUTER_ARGS=${ROUTER_ARGS:-}
PYTHON=${PYTHON:-python}
if [[ -z "${WORKER_URLS:-}" ]]; then
    NUM_SERVERS=${NUM_SERVERS:-$(nvidia-smi -L | wc -l)}
    WORKER_URLS=""
    for (( s = 0; s < NUM_SERVERS; s++ )); do
        WORKER_URLS+="http://$(hostname):$(( BASE_PORT + s )) "
    done
fi

# shellcheck disable=SC2086  # both are lists
exec "$PYTHON" -m sglang_router.launch_router \
    --worker-urls $WORKER_URLS \
    --host 0.0.0.0 --port "$ROUTER_PORT" \
    --policy "$POLICY" \
    $ROUTER_ARGS
