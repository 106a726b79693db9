"""Reward functions for the example agents.

``math_answer_correct`` checks a model's free-form answer against a reference with
Hugging Face's math-verify. math-verify picks the final answer from the text: a
``\\boxed{...}`` or an anchored "The (final) answer is ..." wins; otherwise the last
number or expression in the text counts.

math-verify guards parsing and comparison with ``signal.alarm`` timeouts, which only work
on the main thread (elsewhere it errors out). Agents run inside asyncio, possibly in
worker threads or process pools, so the timeouts are used on the main thread only; off
it they are disabled and the input is instead bounded in length.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["math_answer_correct"]

# Only the tail of a long response is examined: the final answer is at the end, and this
# bounds the work math-verify does when it runs without a timeout.
MAX_RESPONSE_CHARS = 2000
TIMEOUT_S = 5

# math-verify warns (once) that timeouts are disabled; that is deliberate here.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def math_answer_correct(response_text: str, answer: str) -> bool:
    """True when the final answer in ``response_text`` equals ``answer``; never raises."""
    try:
        from math_verify import parse, verify

        if not isinstance(response_text, str) or not response_text.strip():
            return False
        text = response_text[-MAX_RESPONSE_CHARS:]
        timeout = TIMEOUT_S if _on_main_thread() else None
        gold = parse(str(answer), parsing_timeout=timeout)
        if not gold:
            # A reference that is not plain text math-verify can read; try it as LaTeX.
            gold = parse(f"${answer}$", parsing_timeout=timeout)
            if not gold:
                return False
        pred = parse(text, parsing_timeout=timeout)
        if not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=timeout))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # math-verify's TimeoutException is a BaseException
        return False
