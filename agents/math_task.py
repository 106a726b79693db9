"""The example task: arithmetic word problems, their answer check, and their environment.

Not part of the framework: the example agents load it by path, and so can yours.

- `arithmetic_word_problems`: short seeded problems generated in-process (no download),
  sized so that SmolLM2-135M-Instruct solves some but not most of them; name it as a
  trainer dataset with `dataset: {type: python, function:
  agents/math_task.py:arithmetic_word_problems, size: 512, seed: 0}`;
- `math_answer_correct`: a free-form answer checked against the reference with Hugging
  Face's math-verify (a `\\boxed{...}` or an anchored "The answer is ..." wins;
  otherwise the last number or expression counts);
- `MathSingleStepEnv`: the same check as a queue-API environment, "math-single-step".

math-verify guards parsing and comparison with `signal.alarm` timeouts, which only work
on the main thread (elsewhere it errors out). Agents run inside asyncio, possibly in
worker threads or process pools, so the timeouts are used on the main thread only; off
it they are disabled and the input is instead bounded in length.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from trainer.api import EnvironmentService, register_env

DEFAULT_INSTRUCTION = "Give the final answer as a number at the end."
# A worked example in the system prompt raised SmolLM2-135M's first-turn accuracy on these
# problems from 6% to 12% at temperature 1.0 and from 20% to 30% at 0.7 (96 rows each), and
# shortened its answers. Pass system_prompt=None to drop it.
DEFAULT_SYSTEM_PROMPT = (
    "You solve short math word problems. Write the calculation, then the answer. "
    "Example: Tom has 2 apples and gets 3 more. 2 + 3 = 5. The answer is 5."
)

_NAMES = ["Sam", "Mia", "Tom", "Lily", "Ben", "Anna", "Max", "Zoe", "Leo", "Emma", "Jack", "Nora"]
_ITEMS = ["apples", "coins", "books", "pencils", "marbles", "stickers", "cookies", "toys"]
_CONTAINERS = ["boxes", "bags", "baskets", "rows", "jars"]

# Each template: (text with {name} {item} {a} {b} [{container}], how to compute the answer).
_TEMPLATES: dict[str, list[str]] = {
    "add": [
        "{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?",
        "{name} had {a} {item} and found {b} more. How many {item} does {name} have in total?",
        "There are {a} {item} on a table and {b} {item} on a shelf. How many {item} are there altogether?",
    ],
    "sub": [
        "{name} has {a} {item}. {name} gives away {b} {item}. How many {item} does {name} have left?",
        "{name} had {a} {item} and lost {b} of them. How many {item} are left?",
        "There are {a} {item} in a bag. {name} takes out {b}. How many {item} are still in the bag?",
    ],
    "mul": [
        "{name} has {a} {container} with {b} {item} in each. How many {item} does {name} have?",
        "There are {a} {container} and each has {b} {item}. How many {item} are there in total?",
    ],
}
OPERATIONS: tuple[str, ...] = tuple(_TEMPLATES)


def _operands(rng: random.Random, op: str, max_operand: int) -> tuple[int, int, int]:
    if op == "add":
        a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
        return a, b, a + b
    if op == "sub":
        a = rng.randint(2, max_operand)
        b = rng.randint(1, a - 1)
        return a, b, a - b
    # "mul": products of two operands up to max_operand get large fast; keep them small
    top = max(2, min(10, max_operand // 2))
    a, b = rng.randint(2, top), rng.randint(2, top)
    return a, b, a * b


def arithmetic_word_problems(
    size: int,
    seed: int = 0,
    max_operand: int = 20,
    operations: Sequence[str] = OPERATIONS,
    instruction: str | None = DEFAULT_INSTRUCTION,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
) -> list[dict[str, Any]]:
    """Generate ``size`` one-step arithmetic word problems, deterministically from ``seed``.

    ``operations`` picks among ``"add"``, ``"sub"`` (result always >= 1) and ``"mul"``
    (factors in 2..min(10, max_operand // 2)). ``instruction`` is appended to the question;
    ``system_prompt`` (a worked example by default; ``None`` for none) is prepended as a
    system message.
    """
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if max_operand < 2:
        raise ValueError(f"max_operand must be >= 2, got {max_operand}")
    if isinstance(operations, str):
        operations = [operations]
    ops = list(operations)
    if not ops:
        raise ValueError("operations must not be empty")
    for op in ops:
        if op not in _TEMPLATES:
            raise ValueError(f"unknown operation {op!r}; expected one of {list(OPERATIONS)}")

    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for _ in range(size):
        op = rng.choice(ops)
        template = rng.choice(_TEMPLATES[op])
        a, b, result = _operands(rng, op, max_operand)
        question = template.format(
            name=rng.choice(_NAMES),
            item=rng.choice(_ITEMS),
            container=rng.choice(_CONTAINERS),
            a=a,
            b=b,
        )
        content = f"{question} {instruction}" if instruction else question
        messages = [{"role": "user", "content": content}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        rows.append({"messages": messages, "answer": str(result)})
    return rows


# Only the tail of a long response is examined: the final answer is at the end, and this
# bounds the work math-verify does when it runs without a timeout.
MAX_RESPONSE_CHARS = 2000
TIMEOUT_S = 5

# math-verify warns (once) that timeouts are disabled; that is deliberate here.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def math_answer_correct(response_text: str, answer: str) -> bool:
    """True when the final answer in ``response_text`` is a number equal to ``answer``;
    never raises."""
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
        # The answer must be a number, as the question asks: an unevaluated expression
        # ("... is 19 - 6") would let the policy hand the arithmetic to the checker, which
        # an RL run learns within a dozen steps.
        if not pred or not getattr(pred[0], "is_Number", False):
            return False
        return bool(verify(gold, pred, timeout_seconds=timeout))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # math-verify's TimeoutException is a BaseException
        return False


_STATED_ANSWER = re.compile(
    r"answer\s+is\s*:?\s*\$?(?:\\boxed\{)?\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE
)


def stated_answers(response_text: str) -> set[str]:
    """The distinct numbers a reply states as "the answer is N" (any case, optional
    colon, `$` or `\\boxed{`). More than one is a hedge ("The answer is 3. The answer is
    5."): the last-number check would pay for it whenever the last guess is right."""
    if not isinstance(response_text, str):
        return set()
    return {
        m.group(1).rstrip("0").rstrip(".") if "." in m.group(1) else m.group(1)
        for m in _STATED_ANSWER.finditer(response_text[-MAX_RESPONSE_CHARS:])
    }


class MathSingleStepEnv(EnvironmentService):
    """Scores final answers against the reference with math-verify.

    The reference is found by qid (the part before any "@"): tell the env at the start
    of an episode with `await env.reset(options={"qid": qid, "answer": answer})`, or build
    it with `answers={qid: answer, ...}`. `step((qid, [text, ...]))` returns
    `(None, [1.0 or 0.0 per text], True, False, {})`; `step((qid, texts, answer))` scores
    against `answer` directly.
    """

    def __init__(self, answers: dict[str, Any] | None = None, max_tracked: int = 65536) -> None:
        self._answers: OrderedDict[str, str] = OrderedDict(
            (str(k), str(v)) for k, v in (answers or {}).items()
        )
        self.max_tracked = max_tracked

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        options = options or {}
        if "qid" in options and "answer" in options:
            qid = str(options["qid"]).split("@")[0]
            self._answers[qid] = str(options["answer"])
            self._answers.move_to_end(qid)
            while len(self._answers) > self.max_tracked:
                self._answers.popitem(last=False)
        return None, {}

    async def step(self, action: Any) -> tuple[Any, list[float], bool, bool, dict[str, Any]]:
        if not isinstance(action, (tuple, list)) or len(action) not in (2, 3):
            raise ValueError(
                f"math-single-step expects (qid, answers[, reference]), got {action!r}"
            )
        qid, answers = str(action[0]), action[1]
        if isinstance(answers, str):
            answers = [answers]
        if len(action) == 3:
            reference = str(action[2])
        else:
            reference = self._answers.get(qid.split("@")[0])
            if reference is None:
                raise ValueError(
                    f"math-single-step: no reference answer for qid {qid!r}; call "
                    "env.reset(options={'qid': ..., 'answer': ...}) first"
                )
        rewards = await asyncio.to_thread(
            lambda: [1.0 if math_answer_correct(str(a), reference) else 0.0 for a in answers]
        )
        return None, rewards, True, False, {}


register_env("math-single-step", MathSingleStepEnv)
