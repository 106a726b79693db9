"""Fast tests for the example dataset, the math reward and the example agent (no model)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import pickle
import re
import sys
import threading
from pathlib import Path

import pytest

from trainer.datasets import load_dataset, load_jsonl
from trainer.loading import import_file

REPO = Path(__file__).resolve().parents[1]
MATH_TASK = import_file(REPO / "agents" / "math_task.py")  # the example task
DEFAULT_SYSTEM_PROMPT = MATH_TASK.DEFAULT_SYSTEM_PROMPT
arithmetic_word_problems = MATH_TASK.arithmetic_word_problems
math_answer_correct = MATH_TASK.math_answer_correct
ARITHMETIC = str(REPO / "agents" / "math_task.py") + ":arithmetic_word_problems"


def _load_agent_module():
    spec = importlib.util.spec_from_file_location(
        "math_multi_turn_under_test", REPO / "agents" / "math_multi_turn.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # what a by-path loader does, so instances pickle
    spec.loader.exec_module(module)
    return module


# --- dataset -----------------------------------------------------------------------------


def test_arithmetic_is_deterministic():
    assert arithmetic_word_problems(32, seed=3) == arithmetic_word_problems(32, seed=3)
    assert arithmetic_word_problems(32, seed=3) != arithmetic_word_problems(32, seed=4)
    # A longer dataset starts with the shorter one.
    assert arithmetic_word_problems(40, seed=3)[:32] == arithmetic_word_problems(32, seed=3)


def _recompute(question: str) -> int:
    a, b = (int(x) for x in re.findall(r"\d+", question)[:2])
    if re.search(r"gives away|lost|takes out", question):
        return a - b
    if re.search(r"in each|each has", question):
        return a * b
    return a + b


def test_arithmetic_answers_are_correct():
    rows = arithmetic_word_problems(300, seed=0, max_operand=20)
    assert len(rows) == 300
    for row in rows:
        assert set(row) == {"messages", "answer"}
        system, msg = row["messages"]
        assert system == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
        assert msg["role"] == "user"
        assert msg["content"].endswith("Give the final answer as a number at the end.")
        assert int(row["answer"]) == _recompute(msg["content"])
        assert int(row["answer"]) >= 1
    assert {_kind(r) for r in rows} == {"add", "sub", "mul"}
    (only_user,) = arithmetic_word_problems(1, system_prompt=None)[0]["messages"]
    assert only_user["role"] == "user"


def _kind(row):
    q = row["messages"][-1]["content"]
    if re.search(r"gives away|lost|takes out", q):
        return "sub"
    return "mul" if re.search(r"in each|each has", q) else "add"


def test_arithmetic_options():
    rows = arithmetic_word_problems(
        20, seed=1, operations=["sub"], instruction="Just the number.", system_prompt="Be brief."
    )
    for row in rows:
        system, user = row["messages"]
        assert system == {"role": "system", "content": "Be brief."}
        assert user["content"].endswith("Just the number.")
        assert _kind(row) == "sub"
    with pytest.raises(ValueError, match="unknown operation"):
        arithmetic_word_problems(2, operations=["div"])


def test_load_jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(
        json.dumps({"messages": [{"role": "user", "content": "1+1?"}], "answer": "2"})
        + "\n\n"
        + json.dumps({"question": "2+3?", "answer": 5, "id": "q2"})
        + "\n"
    )
    rows = load_jsonl(path)
    assert rows == [
        {"messages": [{"role": "user", "content": "1+1?"}], "answer": "2"},
        {"messages": [{"role": "user", "content": "2+3?"}], "answer": "5", "id": "q2"},
    ]
    assert load_dataset({"type": "jsonl", "path": str(path), "size": 1}) == rows[:1]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("{not json", "invalid JSON"),
        ('{"question": "1+1?"}', "missing key 'answer'"),
        ('{"answer": "2"}', "missing key 'messages'"),
        ('{"messages": [], "answer": "2"}', "'messages' must be"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_load_jsonl_errors_name_the_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}\n' + bad_line + "\n")
    with pytest.raises(ValueError, match=re.escape(f"bad.jsonl:2: {message}")):
        load_jsonl(path)


def test_load_dataset_specs():
    rows = load_dataset({"type": "python", "function": ARITHMETIC, "size": 10, "seed": 7})
    assert rows == arithmetic_word_problems(10, seed=7)
    spec = {"type": "python", "function": ARITHMETIC, "size": 5, "max_operand": 9}
    assert len(load_dataset(spec)) == 5
    with pytest.raises(ValueError, match="unknown dataset type"):
        load_dataset({"type": "gsm9k"})
    with pytest.raises(ValueError, match="bad option"):
        load_dataset({"type": "python", "function": ARITHMETIC, "size": 2, "colour": "red"})
    with pytest.raises(ValueError, match="needs a 'function'"):
        load_dataset({"type": "python"})
    with pytest.raises(ValueError, match="needs a 'path'"):
        load_dataset({"type": "jsonl"})


# --- reward ------------------------------------------------------------------------------

REWARD_CASES = [
    ("12", "12", True),
    ("13", "12", False),
    ("Sam has 5 + 7 = 12 apples in total. The answer is 12.", "12", True),
    ("The final answer is $\\boxed{12}$.", "12", True),
    ("First 4, then 9, so she has 14 coins.", "14", True),  # the last number counts
    ("First 4, then 9, so she has 14 coins.", "9", False),
    ("12.0", "12", True),
    ("I do not know, maybe some apples?", "12", False),
    ("", "12", False),
    ("\\frac{{{", "1", False),
    ("So the final answer is 19 - 6.", "13", False),  # a number, not a sum to work out
    ("Ben has 19 - 6 = 13 cookies. The answer is 13.", "13", True),
]


@pytest.mark.parametrize("text, answer, expected", REWARD_CASES)
def test_math_answer_correct(text, answer, expected):
    assert math_answer_correct(text, answer) is expected


def test_math_answer_correct_never_raises():
    assert math_answer_correct(None, "3") is False  # type: ignore[arg-type]
    assert math_answer_correct("3", None) is False  # type: ignore[arg-type]
    assert math_answer_correct("x" * 100_000 + " so 3", "3") is True


def test_math_answer_correct_off_the_main_thread():
    results = []
    thread = threading.Thread(
        target=lambda: results.extend(math_answer_correct(t, a) for t, a, _ in REWARD_CASES)
    )
    thread.start()
    thread.join()
    assert results == [expected for _, _, expected in REWARD_CASES]


# --- agent -------------------------------------------------------------------------------


class _FakeCompletions:
    def __init__(self, replies, calls):
        self.replies, self.calls = list(replies), calls

    async def create(self, **kwargs):
        self.calls.append(kwargs)
        from types import SimpleNamespace

        content, finish = self.replies.pop(0), "stop"
        if isinstance(content, tuple):
            content, finish = content
        message = SimpleNamespace(content=content)
        return SimpleNamespace(choices=[SimpleNamespace(message=message, finish_reason=finish)])


def _run_agent(monkeypatch, replies, **agent_kwargs):
    module = _load_agent_module()
    calls: list[dict] = []
    created: list[dict] = []

    class FakeClient:
        def __init__(self, **kwargs):
            created.append(kwargs)
            from types import SimpleNamespace

            self.chat = SimpleNamespace(completions=_FakeCompletions(replies, calls))

        async def close(self):
            pass

    monkeypatch.setattr(module, "AsyncOpenAI", FakeClient)
    agent = module.MathMultiTurnAgent(**agent_kwargs)
    pickle.dumps(agent)
    row = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"}
    reward = asyncio.run(agent.run(row, base_url="http://gw/v1", api_key="k"))
    return reward, calls, created, module


def test_agent_reward_and_retry(monkeypatch):
    reward, calls, created, _ = _run_agent(monkeypatch, ["The answer is 5."])
    assert reward == 1.0 and len(calls) == 1
    assert created == [{"base_url": "http://gw/v1", "api_key": "k", "max_retries": 0}]
    assert calls[0]["max_tokens"] == 64 and calls[0]["temperature"] == 1.0

    reward, calls, _, module = _run_agent(monkeypatch, ["It is 6.", "Sorry, it is 5."])
    assert reward == 0.5 and len(calls) == 2
    assert calls[1]["messages"][-2:] == [
        {"role": "assistant", "content": "It is 6."},
        {"role": "user", "content": "Unfortunately your answer is wrong. Let's try again."},
    ]
    assert module.RETRY_MESSAGE == "Unfortunately your answer is wrong. Let's try again."

    reward, calls, _, _ = _run_agent(
        monkeypatch, ["6", "7", "8"], max_turns=3, max_tokens=16, temperature=0.5
    )
    assert reward == 0.0 and len(calls) == 3
    assert calls[0]["max_tokens"] == 16 and calls[0]["temperature"] == 0.5

    # an answer cut off at max_tokens is wrong, right number or not, unless asked not to
    cut = ("The answer is 5. The answer is 5. The answer is", "length")
    reward, calls, _, _ = _run_agent(monkeypatch, [cut, "The answer is 5."])
    assert reward == pytest.approx(0.5 - 0.2) and len(calls) == 2  # right, after a malformed try
    reward, _, _, _ = _run_agent(monkeypatch, [cut], require_stop=False)
    assert reward == 1.0


def test_a_rambling_or_hedging_reply_ranks_below_a_clean_wrong_one(monkeypatch):
    """The demo's reward orders the forms a collapsing run drifts into below a clean
    wrong answer, so a group holding both pushes away from them (#30)."""
    clean_wrong, _, _, _ = _run_agent(monkeypatch, ["2 + 3 = 6. The answer is 6."], max_turns=1)
    hedged, _, _, _ = _run_agent(monkeypatch, ["The answer is 3. The answer is 5."], max_turns=1)
    rambling, _, _, _ = _run_agent(monkeypatch, [("The answer is 5 and", "length")], max_turns=1)
    right, _, _, _ = _run_agent(monkeypatch, ["2 + 3 = 5. The answer is 5."], max_turns=1)
    assert (right, clean_wrong, hedged, rambling) == (1.0, 0.0, -0.2, -0.2)
    # a hedge that ends on the right number is not paid for the right number
    assert hedged < clean_wrong
    unpenalised, _, _, _ = _run_agent(
        monkeypatch, ["The answer is 3. The answer is 5."], max_turns=1, malformed_penalty=0.0
    )
    assert unpenalised == 0.0


@pytest.mark.parametrize(
    "text, stated",
    [
        ("The answer is 3. The answer is 5. The Answer is 5", {"3", "5"}),
        ("2 + 3 = 5. The answer is 5.", {"5"}),
        ("The final answer is: $\\boxed{12}$", {"12"}),
        ("The answer is 5.0, so the answer is 5", {"5"}),
        ("Tom has 5 apples.", set()),
    ],
)
def test_stated_answers(text, stated):
    assert MATH_TASK.stated_answers(text) == stated
