"""After the load: is every answered request in the gateway's SQLite store?"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bench.load import Record


def check_store(db_path: Path, records: list[Record]) -> tuple[bool, str]:
    """Whether every 200 is stored once, under its session; and the verdict in words,
    with how many later turns are linked to their parent and continue its tokens."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT id, session_id, parent_id, tokens_continue_parent FROM completions "
            "WHERE endpoint = 'chat.completions'"
        ).fetchall()
    finally:
        con.close()
    stored = {r[0]: r for r in rows}
    ids = [r.response_id for r in records]
    duplicates = len(ids) - len(set(ids))
    missing = sum(i not in stored for i in ids)
    found = [r for r in records if r.response_id in stored]
    wrong_session = sum(stored[r.response_id][1] != r.session_id for r in found)
    by_turn = {(r.conversation, r.turn): r.response_id for r in found}
    later = [stored[r.response_id] + (r,) for r in found if r.turn > 0]
    linked = sum(
        parent is not None and parent == by_turn.get((r.conversation, r.turn - 1))
        for _, _, parent, _, r in later
    )
    ok = len(records) == len(stored) and not (missing or wrong_session or duplicates)
    text = (
        f"{'PASS' if ok else 'FAIL'}: {len(records)} answered (HTTP 200), {len(stored)} chat "
        f"completions in the store, {missing} answered ids missing, {wrong_session} under "
        "the wrong session"
    )
    if duplicates:
        text += f", {duplicates} ids answered twice"
    if later:
        continues = sum(bool(row[3]) for row in later)
        text += (
            f"; later turns linked to their parent: {linked}/{len(later)}, "
            f"prompt tokens continue the parent's: {continues}/{len(later)}"
        )
    return ok, text
