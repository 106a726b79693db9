#!/usr/bin/env bash
# One node of the Ray cluster that places agents (docs/scaling.md): the head, or a
# worker that joins it. tests/test_two_nodes.py runs this file, with --block, in two
# network namespaces; cluster.yaml (`ray up`) runs it on real machines.
#
#   NODE_IP=10.0.0.1 deploy/ray/node.sh head   [more `ray start` flags, e.g. --block]
#   NODE_IP=10.0.0.2 HEAD_IP=10.0.0.1 RESOURCES='{"sandbox": 8}' deploy/ray/node.sh worker
#
# Every node and every driver (the trainer's rank 0) holds the same RAY_AUTH_TOKEN:
# Ray's token authentication, so that nobody else on the network can run code here.
# The dashboard is off and usage stats are never sent.
set -euo pipefail

ROLE=${1:?usage: node.sh head|worker [ray start flags...]}
shift
NODE_IP=${NODE_IP:?the address other nodes reach this one at}
: "${RAY_AUTH_TOKEN:?a secret shared by every node and driver (e.g. openssl rand -hex 32)}"
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0
RAY=${RAY:-ray}
RAY_PORT=${RAY_PORT:-6379}

args=(
    --node-ip-address "$NODE_IP"
    --num-cpus "${NUM_CPUS:-$(nproc)}"
    --resources "${RESOURCES:-{\}}"
    --object-store-memory "${OBJECT_STORE_BYTES:-200000000}"
    --disable-usage-stats
)
if [[ -n "${TEMP_DIR:-}" ]]; then
    args+=(--temp-dir "$TEMP_DIR")
fi

case "$ROLE" in
    head) exec "$RAY" start --head --port "$RAY_PORT" --include-dashboard=false "${args[@]}" "$@" ;;
    worker)
        HEAD_IP=${HEAD_IP:?the head node address}
        exec "$RAY" start --address "$HEAD_IP:$RAY_PORT" "${args[@]}" "$@" ;;
    *) echo "node.sh: role must be head or worker, not $ROLE" >&2; exit 2 ;;
esac
