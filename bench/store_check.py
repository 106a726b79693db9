"""After the load: is every answered request in the gateway's SQLite store?"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from bench.load import Record


@dataclass
class StoreCheck:
    answered: int  # 200 responses the agents got from the gateway
    stored: int  # chat completions in the database
    missing: list[str] = field(default_factory=list)  # answered ids not in the store
    wrong_session: list[str] = field(default_factory=list)
    duplicates: int = 0  # answered ids seen twice by the agents
    linked: int = 0  # turns > 0 whose parent is the previous turn
    unlinked: int = 0  # turns > 0 with another (or no) parent
    tokens_continue: int = 0  # turns > 0 whose prompt tokens continue the parent's

    @property
    def ok(self) -> bool:
        return (
            self.answered == self.stored
            and not self.missing
            and not self.wrong_session
            and not self.duplicates
        )

    def describe(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        text = (
            f"{verdict}: {self.answered} answered (HTTP 200), {self.stored} chat completions "
            f"in the store, {len(self.missing)} answered ids missing, "
            f"{len(self.wrong_session)} under the wrong session"
        )
        if self.duplicates:
            text += f", {self.duplicates} ids answered twice"
        later = self.linked + self.unlinked
        if later:
            text += (
                f"; later turns linked to their parent: {self.linked}/{later}, "
                f"prompt tokens continue the parent's: {self.tokens_continue}/{later}"
            )
        return text


def check_store(db_path: Path, records: list[Record]) -> StoreCheck:
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
    check = StoreCheck(answered=len(records), stored=len(stored))
    check.duplicates = len(ids) - len(set(ids))
    by_turn: dict[tuple[int, int], str] = {}
    for r in records:
        row = stored.get(r.response_id)
        if row is None:
            check.missing.append(r.response_id)
            continue
        if row[1] != r.session_id:
            check.wrong_session.append(r.response_id)
        by_turn[(r.conversation, r.turn)] = r.response_id
    for r in records:
        if r.turn == 0 or r.response_id not in stored:
            continue
        _, _, parent_id, continues = stored[r.response_id]
        if parent_id is not None and parent_id == by_turn.get((r.conversation, r.turn - 1)):
            check.linked += 1
        else:
            check.unlinked += 1
        if continues:
            check.tokens_continue += 1
    return check
