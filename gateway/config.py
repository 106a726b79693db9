"""Gateway settings. `turnstile serve` makes one flag per field (with its `help`), and
the trainer's `gateway:` YAML section is this same dataclass."""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass, field
from typing import Any

# how a turn's prompt is built from the earlier turn it continues (GatewayConfig.prompt_mode)
PROMPT_MODES = ("template", "token_exact")


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    shown: str | None = None,
    old: str | None = None,
) -> Any:
    """A config field: its default (a list or dict copied, a callable called, for each
    instance), what it means (shown by `--help`, `turnstile train --help-config` and
    docs/training.md), its CLI flag when not --<name>, how to show a default computed at
    start-up (`shown`), and its former name (`old`: still read, so what users wrote
    keeps working)."""
    meta = {"help": help, "flag": flag, "shown": shown, "old": old}
    if isinstance(default, (list, dict)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata=meta)
    if callable(default):
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def reachable_host(host: str) -> str:
    """The address others reach a gateway bound to `host` at: `host` itself, or for a
    wildcard bind, the address of the interface the default route leaves through (the
    host name's address where there is no route)."""
    if host not in WILDCARD_HOSTS:
        return host
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # UDP: nothing is sent, the kernel picks a route
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


@dataclass
class GatewayConfig:
    host: str = setting(
        "127.0.0.1",
        "address to bind (non-loopback needs an admin key); agents on other machines "
        "need this machine's address, or 0.0.0.0 (every interface; its URL then names "
        "the address of the default route)",
    )
    port: int = setting(0, "port; 0: any free one (`turnstile serve` defaults to 8000)")
    database: str | None = setting(
        None,
        "SQLite file path or SQLAlchemy URL; none: turnstile.db here (serve) or "
        "<run_dir>/sessions.db (training)",
    )
    admin_key: str | None = setting(
        lambda: os.environ.get("TURNSTILE_ADMIN_KEY") or None,
        "admin key (default: $TURNSTILE_ADMIN_KEY)",
        shown="$TURNSTILE_ADMIN_KEY",
    )
    signing_keys: str | None = setting(
        lambda: os.environ.get("TURNSTILE_SIGNING_KEYS") or None,
        "secrets the gateway signs its thinking blocks with, comma-separated: the first "
        "signs, all verify (default: $TURNSTILE_SIGNING_KEYS; none: keys kept in the "
        "store, shared by its replicas; gateway/signing.py)",
        shown="$TURNSTILE_SIGNING_KEYS",
    )
    signing_key_grace_s: float = setting(
        24 * 3600.0,
        "how long a stored signing key still verifies after a newer one is made, seconds "
        "(at least the longest session: session_ttl_s)",
    )
    engine: str = setting("embedded", "inference engine (gateway/inference/registry.py)")
    model: str | None = setting(
        None,
        "local HF folder (default: the bundled SmolLM2-135M-Instruct); with an external "
        "engine, the tokenizer and chat template of the model it serves",
    )
    engine_urls: list[str] = setting(
        [],
        "an engine server or router (repeat for several: each session sticks to one)",
        flag="--engine-url",
    )
    engine_update_urls: list[str] = setting(
        [],
        "a server that weight updates go to (repeatable; default: the --engine-url "
        "servers, or the workers a router lists)",
        flag="--engine-update-url",
    )
    engine_max_context: int = setting(
        4096, "context length to assume when the engine servers do not report theirs"
    )
    served_model_name: str = setting("default", "the model name /v1/models reports")
    device: str = setting("cpu", "torch device of the embedded engine")
    max_batch_size: int = setting(32, "most requests the embedded engine decodes together")
    default_max_tokens: int = setting(512, "answer length when a request sets none")
    session_ttl_s: float = setting(24 * 3600, "longest a session key lives, seconds")
    request_timeout_s: float = setting(
        600.0, "longest an engine may take for one answer (then 503)", flag="--request-timeout"
    )
    fake_delay_s: float = setting(
        0.0,
        "the fake engine's time to answer, seconds (a stand-in for decoding in load and "
        "fault tests: retries that arrive while the original is still generating)",
    )
    max_body_bytes: int = setting(16 * 1024 * 1024, "larger request bodies get a 413")
    max_pending_requests: int = setting(1024, "choices generating at once; more get a 429")
    max_n: int = setting(16, "largest `n` (choices per request); more get a 422")
    auth_failure_limit: int = setting(
        20,
        "failed key checks (a missing key does not count; an unknown, malformed or expired "
        "one does) a client (its IP; IPv6: its /64) may make within auth_failure_window_s; "
        "then each of its keyed requests gets a 429 with Retry-After for auth_lockout_s; "
        "0: no limit (docs/security.md)",
    )
    auth_failure_window_s: float = setting(
        60.0, "the sliding window auth_failure_limit counts failures in, seconds"
    )
    auth_lockout_s: float = setting(
        60.0, "how long a client over auth_failure_limit is refused, seconds"
    )
    parent_cache_size: int = setting(
        4096,
        "recent answers kept in memory to link the next turn (LRU; older: a DB read); "
        "only sessions still talking need theirs",
    )
    parent_cache_tokens: int = setting(
        4_000_000,
        "most prompt + output tokens those answers may hold together (a long session's "
        "answer holds its whole prompt); LRU",
    )
    body_cache_mb: int = setting(
        256,
        "recent request bodies kept per session so that the next turn's body is parsed "
        "and hashed only where it is new (LRU; as many sessions as parent_cache_size)",
    )
    key_cache_size: int = setting(100_000, "session keys kept in memory (LRU; older: a DB read)")
    word_cache_size: int = setting(
        65_536,
        "pre-tokens whose ids the ASCII encoder keeps (LRU; 0: every encode through the "
        "Rust tokenizer)",
    )
    history_cache_size: int = setting(
        256,
        "conversations whose normalised messages the chat renderer keeps (LRU), so that a "
        "long session's history is normalised once, not on every turn",
    )
    tool_parser: str = setting(
        "auto", "tool-call format to parse (gateway/chat/families); auto: from the template"
    )
    reasoning_parser: str = setting(
        "auto",
        "reasoning format to parse (gateway/chat/families); auto: from the template; "
        "none: no reasoning is split off",
    )
    prompt_mode: str = setting(
        "template",
        "how a turn's prompt is built from an earlier turn it continues: template (the "
        "chat template renders the whole conversation, as the model was trained) or "
        "token_exact (the earlier turn's prompt + output ids, then only the new messages "
        "rendered: every turn extends the last, but the model sees what its template "
        "would hide, e.g. earlier reasoning); a session may choose its own",
        old="history",
    )
    run_dirs: list[str] = setting(
        [],
        "a training run folder whose metrics.jsonl the /ui run page charts (repeat for "
        "several); `turnstile train` adds its own",
        flag="--run-dir",
    )
    chat_template: str | None = setting(
        None,
        "a Jinja chat template file, or the name of one in gateway/chat/templates "
        "(e.g. llama3_1_json), used instead of the tokenizer's own",
    )
