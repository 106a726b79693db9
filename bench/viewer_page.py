"""How long the /ui session page takes for a long session: 64 turns, each adding ~400
prompt tokens and 50 output tokens (~29k tokens at the end), built and rendered as the
route does (build_session_view + the Jinja template), under both export styles.

    PYTHONPATH=. .venv/bin/python bench/viewer_page.py

The first build decodes every distinct token id once (then cached per gateway).
"""

from __future__ import annotations

import random
import time
from types import SimpleNamespace
from typing import Any

from gateway.inference.model_source import load_tokenizer, resolve_model_dir
from gateway.ui.routes import templates
from gateway.ui.session_view import build_session_view
from gateway.ui.tokens import TokenTexts

TURNS, NEW_PROMPT, OUTPUT = 64, 400, 50


def long_session(seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(100, 40000) for _ in range(n)]  # noqa: E731
    comps, prompt, parent = [], [1, *ids(300)], None
    for t in range(TURNS):
        out = ids(OUTPUT)
        comps.append(
            dict(id=f"c{t}", parent_id=parent, prompt_ids=list(prompt), output_ids=out,
                 output_logprobs=[-0.5] * OUTPUT, output_versions=[0] * OUTPUT,
                 reward=1.0 if t == TURNS - 1 else None, finish_reason="stop", request={},
                 response={"message": {"content": "x"}}, diagnostics={}, created_at=float(t),
                 endpoint="chat.completions", prompt_tokens=len(prompt),
                 completion_tokens=OUTPUT, timings={"total_s": 0.1},
                 tokens_continue_parent=parent is not None, choice_index=0)
        )  # fmt: skip
        prompt, parent = prompt + out + ids(NEW_PROMPT), f"c{t}"
    return comps


def main() -> None:
    texts = TokenTexts(load_tokenizer(resolve_model_dir(None)))
    comps = long_session()
    info = SimpleNamespace(id="sess-bench", meta={}, prompt_mode=None)
    print(f"{TURNS} turns, {len(comps[-1]['prompt_ids']) + OUTPUT} tokens at the end")
    for label, style in (("cold", "individual"), ("warm", "individual"), ("warm", "concat")):
        t0 = time.perf_counter()
        view = build_session_view("sess-bench", comps, texts, style, 0.9)
        t1 = time.perf_counter()
        html = templates.get_template("session.html").render(
            info=info, view=view, styles=[style], status="ended"
        )
        t2 = time.perf_counter()
        print(
            f"{style:<10} {label}: view {t1 - t0:.2f} s, render {t2 - t1:.2f} s, "
            f"{len(html) / 1e6:.1f} MB of HTML"
        )


if __name__ == "__main__":
    main()
