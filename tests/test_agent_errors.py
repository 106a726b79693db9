"""What a failed agent run says: the SDK's error and the transport's error under it."""

from __future__ import annotations

import openai
import pytest

from trainer.evaluation import EvalConfig, summarise
from trainer.rollout.agent_runner import described


async def test_a_connection_error_names_the_transport_error_under_it() -> None:
    # port 9 on loopback: nothing listens, the connection is refused
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.APIConnectionError) as raised:
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    await client.close()
    assert described(raised.value).startswith(
        "APIConnectionError: Connection error. (from ConnectError: "
    )


def test_an_error_raised_from_none_or_repeating_its_cause_is_said_once() -> None:
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            raise ValueError("agent failed") from None
    except ValueError as exc:
        assert described(exc) == "ValueError: agent failed"
    cause = OSError("pipe closed")
    wrapped = RuntimeError(f"worker died: {cause}")
    wrapped.__cause__ = cause
    assert described(wrapped) == "RuntimeError: worker died: pipe closed"


def test_an_evaluation_says_how_many_episodes_failed() -> None:
    result = summarise([1.0, None, 0.0, None], EvalConfig(), step=0, version=0, seconds=1.0)
    assert result.errors == 2 and result.accuracy == 0.25
    assert "2 failed, counted as wrong" in result.summary()
    clean = summarise([1.0, 0.0], EvalConfig(), step=0, version=0, seconds=1.0)
    assert "failed" not in clean.summary()
