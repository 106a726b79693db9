"""Parent links in long sessions: a turn's conversation hash resumes from its parent's.

Every turn of a 64-turn session sends its whole history; hashing it all again each turn
made linking cost grow with the session. A turn that repeats its parent's messages and
answer starts from the parent's hash state instead, and must get the same hashes and
the same parent as hashing the whole conversation would.
"""

from __future__ import annotations

import pytest
from gateway_helpers import completion_record, openai_client

import gateway.serving.prompt
from gateway.chat.linking import ConversationHash, framed, last_answer

TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
ANSWER = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"a": 1}'}}
    ],
}


def history(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}]
    for t in range(turns):
        messages += [
            {"role": "assistant", "content": f"Step {t}."},
            {"role": "user", "content": f"Output {t}:\n" + "line\n" * 50},
        ]
    return messages


def test_a_resumed_hash_equals_the_whole_conversations() -> None:
    parent_request = history(3)
    parent = ConversationHash(parent_request, TOOLS)
    answer_hash = parent.with_answer(ANSWER)
    resume = parent.resume_point(answer_hash)
    assert resume is not None and resume.hash == answer_hash
    # the client sends the answer back re-serialised: arguments re-dumped, refusal: null
    sent_back = {**ANSWER, "refusal": None}
    sent_back["tool_calls"] = [
        {**ANSWER["tool_calls"][0], "function": {"name": "read", "arguments": '{"a":1}'}}
    ]
    child = [*parent_request, sent_back, {"role": "tool", "tool_call_id": "c1", "content": "x"}]
    k = last_answer(child)
    assert k == len(parent_request)
    assert resume.continued_by(child, TOOLS, framed(child[k]))

    resumed = ConversationHash(child, TOOLS, resume)
    whole = ConversationHash(child, TOOLS)
    assert resumed.candidates[0] == whole.candidates[0] == answer_hash
    final = {"role": "assistant", "content": "Done."}
    assert resumed.with_answer(final) == whole.with_answer(final)


@pytest.mark.parametrize("change", ["earlier_message", "tools", "answer"])
def test_a_request_that_changed_the_history_does_not_resume(change) -> None:
    parent_request = history(3)
    parent = ConversationHash(parent_request, TOOLS)
    resume = parent.resume_point(parent.with_answer(ANSWER))
    child = [*parent_request, ANSWER, {"role": "user", "content": "More."}]
    tools = TOOLS
    if change == "earlier_message":
        child[3] = {"role": "user", "content": "Output 0 (edited)"}
    elif change == "tools":
        tools = []
    else:
        child[len(parent_request)] = {"role": "assistant", "content": "Something else."}
    k = last_answer(child)
    assert not resume.continued_by(child, tools, framed(child[k]))


def test_the_gateway_resumes_each_turns_hash_and_links_every_turn(
    fake_gateway, new_session, monkeypatch
) -> None:
    resumed: list[bool] = []

    class Spy(ConversationHash):
        def __init__(self, messages, tools, resume=None) -> None:
            resumed.append(resume is not None)
            super().__init__(messages, tools, resume)

    monkeypatch.setattr(gateway.serving.prompt, "ConversationHash", Spy)
    session_id, key = new_session(fake_gateway)
    client = openai_client(fake_gateway, key)
    messages = history(0)
    ids = []
    for turn in range(5):
        reply = client.chat.completions.create(model="default", messages=messages)
        ids.append(reply.id)
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": f"Output {turn}:\n" + "line\n" * 50},
        ]
    # the first turn has no answer to resume from; every later one resumes
    assert resumed == [False, True, True, True, True]
    for parent, child in zip(ids, ids[1:], strict=False):
        rec = completion_record(fake_gateway, session_id, child)
        assert rec["parent_id"] == parent
        assert rec["tokens_continue_parent"] is True
