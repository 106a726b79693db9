#!/usr/bin/env bash
# One gateway replica of the training layout (docs/scaling.md), listening on this
# node's address; every replica uses the same PostgreSQL and admin key, and the
# trainer lists them all in `gateway.urls`. tests/test_two_nodes.py runs this file on
# each of its two nodes.
#
#   NODE_IP=10.0.0.1 DATABASE=postgresql+psycopg://user@db-host/turnstile \
#   TURNSTILE_ADMIN_KEY=... deploy/ray/gateway.sh [more `turnstile serve` flags]
#
# A gateway off loopback refuses to start without an admin key. Its embedded engine
# takes the trainer's weight pushes (POST /admin/weights/group and /push, no disk);
# with --engine vllm or sglang, add --engine-url for its servers. On CPU, set
# GLOO_SOCKET_IFNAME to the interface the trainer's rank 0 is reached through: gloo
# otherwise listens on the address the host name resolves to.
set -euo pipefail

NODE_IP=${NODE_IP:?the address agents and the trainer reach this gateway at}
DATABASE=${DATABASE:?a PostgreSQL URL every replica shares}
: "${TURNSTILE_ADMIN_KEY:?the admin key every replica and the trainer share}"
TURNSTILE=${TURNSTILE:-turnstile}

exec "$TURNSTILE" serve --host "$NODE_IP" --port "${GATEWAY_PORT:-8000}" \
    --database "$DATABASE" "$@"
