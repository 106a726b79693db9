"""The completion record: the one shape every generation is stored in.

Built here only, whether the generation came over HTTP (chat, completions, responses)
or straight from the trainer's token-level and queue APIs, so every row carries the
same exact prompt ids, output ids, logprobs and per-token policy versions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

from gateway.store.codec import pack_floats, pack_ints
from gateway.store.delta import Full, delta_columns
from gateway.store.schema import CompletionRow


@dataclass(slots=True)
class CompletionRecord:
    id: str
    session_id: str
    endpoint: str  # chat.completions | completions | responses | direct
    model: str
    request: dict[str, Any]  # what the client asked for
    response: dict[str, Any]  # what it was answered (the endpoint's own shape)
    prompt_ids: list[int]  # exactly as the engine saw them
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]  # policy version of each output token
    finish_reason: str
    prefix_hash: str  # what a later turn continuing this one is looked up by
    parent_id: str | None = None
    tokens_continue_parent: bool | None = None
    request_hash: str | None = None  # body hash: a client retry is answered from this row
    choice_index: int = 0
    side_request: bool = False  # a client's side request: not trained on by default
    diagnostics: dict[str, Any] | None = None  # parse failures, drift (see schema.py)
    queue_s: float = 0.0
    gen_s: float = 0.0
    total_s: float = 0.0
    created_at: float = field(default_factory=time.time)
    parent: Full | None = None  # the parent as asked: this row is stored as a delta on it

    def to_row(self) -> dict[str, Any]:
        """The `completions` table row: token arrays packed to compact binary, request
        and prompt ids as a delta on the parent's where the turn continues it."""
        n = len(self.output_ids)
        return {
            **{name: getattr(self, name) for name in _COLUMNS},
            **delta_columns(
                self.parent, self.request, self.prompt_ids, self.tokens_continue_parent
            ),
            "output_ids": pack_ints(self.output_ids),
            "output_logprobs": pack_floats(self.output_logprobs[:n]),
            "output_versions": pack_ints(self.output_versions[:n]),
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": n,
        }


# fields stored as they are: the columns, less those packed or stored as a delta
_BUILT = {"request", "prompt_ids", "output_ids", "output_logprobs", "output_versions"}
_COLUMNS = [
    f.name
    for f in fields(CompletionRecord)
    if f.name in CompletionRow.__table__.c and f.name not in _BUILT
]
