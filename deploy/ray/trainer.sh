#!/usr/bin/env bash
# One node's share of the DeepSpeed trainer (docs/scaling.md): torchrun on every
# trainer node, NODE_RANK 0 on the node whose rank 0 pushes weights and places agents.
# tests/test_two_nodes.py runs it on each of its two nodes (one rank each, gloo over
# the link between them).
#
#   HEAD_IP=10.0.0.1 NNODES=2 NODE_RANK=0 deploy/ray/trainer.sh CONFIG.yaml [key.sub=value ...]
#
# The config names the gateways (`gateway.urls`, `gateway.admin_key`) and the Ray
# cluster (`ray.address: HEAD_IP:6379`, `rollout.agent.mode: ray`); rank 0 also needs
# RAY_AUTH_TOKEN. On CPU set GLOO_SOCKET_IFNAME to the interface the nodes share.
set -euo pipefail

CONFIG=${1:?usage: trainer.sh CONFIG.yaml [overrides...]}
shift
PYTHON=${PYTHON:-python}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token} RAY_USAGE_STATS_ENABLED=0

exec "$PYTHON" -m torch.distributed.run \
    --nnodes "${NNODES:?how many trainer nodes}" --node_rank "${NODE_RANK:?this node}" \
    --nproc_per_node "${PROCS_PER_NODE:-1}" \
    --master_addr "${HEAD_IP:?rank 0 node address}" --master_port "${MASTER_PORT:-29500}" \
    -m trainer.cli train --config "$CONFIG" "$@"
