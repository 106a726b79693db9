"""Serving `POST /v1/messages`: the Anthropic Messages API on the shared template
(gateway/serving/endpoint.py), recorded like every other turn under its `msg_...` id.

Only its own steps: its messages as chat messages (protocol.py), its blocks and events
(events.py), the generated tool arguments a later turn renders instead of the client's
re-serialised input, signed thinking, side requests (docs/gateway.md, "Anthropic
Messages API").
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi.concurrency import run_in_threadpool

from gateway.chat.events import ToolCall
from gateway.chat.tools import check_tool_choice
from gateway.entrypoints.anthropic.messages import protocol as p_
from gateway.entrypoints.anthropic.messages.events import MessageChoice, error_event
from gateway.entrypoints.anthropic.messages.protocol import (
    CountTokensRequest,
    MessagesRequest,
)
from gateway.frozen import freeze
from gateway.lru import LRU, HistoryMemo
from gateway.serving.endpoint import Choice, Prepared, ServingEndpoint, Stages
from gateway.serving.generate import Sampling
from gateway.serving.turn import Answer, ChoiceOutput, Turn, recorded_answer
from gateway.store.repository import SessionInfo

# A system prompt that asks for a title of the conversation, with no tools
# offered: a client's side request (Claude Code names its sessions this way).
_SIDE_PROMPT = re.compile(r"\btitle\b", re.IGNORECASE)


class MessagesServing(ServingEndpoint[MessagesRequest]):
    endpoint = "messages"
    history_field = "messages"
    FIELD = ("messages", "invalid_request")  # what a prompt error names

    def __init__(self, stages: Stages) -> None:
        super().__init__(stages)
        self.signing, self.repo = stages.signing, self.records.repo
        size = self.config.parent_cache_size
        # (session id, message id) -> {tool_use id: arguments generated}: saves a DB read
        # per turn. By session too: a `toolu_` id names its answer, not who may read it
        self._arguments: LRU[tuple[str, str], dict[str, str]] = LRU(
            size, group=operator.itemgetter(0)
        )
        # session id -> the model its agent talks to (a request naming another is a side one)
        self._main_model: LRU[str, str] = LRU(size)
        # a history's (system prompt, chat form) (see `chat_of`)
        self._chats: HistoryMemo[tuple[Any, list[dict[str, Any]]]] = HistoryMemo(size)

    def forget(self, session_id: str) -> None:
        self._arguments.drop_group(session_id)
        self._main_model.pop(session_id)

    def validate(self, req: MessagesRequest) -> None:
        check_tool_choice(p_.chat_tool_choice(req.tool_choice), p_.chat_tools(req.tools))

    async def chat_of(
        self, req: CountTokensRequest, session_id: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, Any]:
        """The request as chat messages, tools and tool choice.

        A session's next body holds its previous one's very message objects
        (incremental_body.py), so only its new messages are converted, not a Claude Code
        history of hundreds of blocks every turn (~0.25 ms at 128 messages), and the chat
        messages are the same objects turn after turn: the template's normalised forms,
        the parent link and the windowed render then take them as they are (kept per
        history: `HistoryMemo`)."""
        start, head = 0, None
        hit = self._chats.get(req.messages)
        if hit is not None and hit[1][0] == req.system:
            start, (_, head) = hit
        tool_ids, key_ids = p_.sent_back(req, start)
        known = await self._tool_arguments(session_id, tool_ids)
        await self.signing.refresh(key_ids)
        own_thinking = partial(self.signing.verify, p_.THINKING, session_id)
        messages = p_.to_chat(req, known.get, own_thinking, start, head)
        _, messages = self._chats.put(req.messages, (req.system, messages))  # frozen
        return messages, p_.chat_tools(req.tools), p_.chat_tool_choice(req.tool_choice)

    async def prepare(self, req: MessagesRequest, session: SessionInfo) -> Prepared:
        messages, tools, tool_choice = await self.chat_of(req, session.id)
        prompt = await self.prompts.chat(session, messages, tools, tool_choice, self.FIELD)
        sampling = Sampling(req.max_tokens, stops=req.stop_sequences)
        turn = self.turn(req, session, prompt, [p_.new_message_id()], sampling)
        if turn.params.max_new_tokens < req.max_tokens:  # clamped, never a 400
            turn.request["max_tokens_clamped_to"] = turn.params.max_new_tokens
        turn.side_request = await self._is_side_request(req, session.id, tools)
        start = p_.message(turn.ids[0], req.model, [], None, None, p_.usage(len(prompt.ids), 0))
        parser = self.generator.output_parser(prompt.text, bool(tools) and tool_choice != "none")
        choice = MessageChoice(start, self._signer(session.id), parser, emit=req.stream)
        return Prepared(req, [turn], stream=req.stream, choice=choice)

    def _signer(self, session_id: str) -> Callable[[str], str]:
        """What signs this session's thinking blocks."""
        return partial(self.signing.sign, p_.THINKING, session_id)

    async def _tool_arguments(self, session_id: str, tool_ids: list[str]) -> dict[str, str]:
        """The generated arguments of the gateway's own tool calls among `tool_ids`."""
        found: dict[str, str] = {}
        for message_id in dict.fromkeys(filter(None, map(p_.message_of_tool_use, tool_ids))):
            arguments = self._arguments.get((session_id, message_id))
            if arguments is None:
                row = await run_in_threadpool(self.repo.completion, session_id, message_id)
                if row is None or row["endpoint"] != self.endpoint:
                    continue
                arguments = (row["response"] or {}).get("tool_arguments") or {}
                self._arguments.put((session_id, message_id), freeze(arguments))
            found.update(arguments)
        restored = sum(1 for t in tool_ids if t in found)
        if restored:
            self.records.metrics.inc("turnstile_tool_inputs_restored_total", restored)
        return found

    async def _is_side_request(
        self, req: MessagesRequest, session_id: str, tools: list[dict[str, Any]] | None
    ) -> bool:
        """Another model than the session's agent talks to, or no tools and a system
        prompt asking for a title."""
        if not tools and _SIDE_PROMPT.search(p_.system_text(req.system)):
            return True
        main = self._main_model.get(session_id)
        if main is None:
            main = await run_in_threadpool(self.repo.main_model, session_id, self.endpoint)
            if main is None:  # this is the session's first main request
                self._main_model.put(session_id, req.model)
                return False
            self._main_model.put(session_id, main)
        return req.model != main

    def finish(self, p: Prepared, turn: Turn, choice: Choice, out: ChoiceOutput) -> Answer:
        assert isinstance(choice, MessageChoice)
        message = choice.message(out)  # (its calls' ids are the choice's toolu_ ones by now)
        calls = "tool_calls" in message
        reason = p_.stop_reason(out.finish_reason, calls, out.stop_string)
        finish = "tool_calls" if reason == "tool_use" else out.finish_reason
        stop_sequence = out.stop_string if reason == "stop_sequence" else None
        tokens = p_.usage(len(turn.prompt_ids), len(out.output_ids))
        body = p_.message(turn.ids[0], p.req.model, choice.blocks, reason, stop_sequence, tokens)
        if calls:
            self._arguments.put((turn.session_id, turn.ids[0]), freeze(choice.tool_arguments))
        if not turn.side_request:
            self._main_model.put(turn.session_id, p.req.model)
        answer_hash = turn.answer_hash(message)
        response = {"message": body, "tool_arguments": choice.tool_arguments}
        return Answer(out, finish, response, answer_hash, message)

    def response(self, p: Prepared, answers: list[Answer]) -> dict[str, Any]:
        return answers[0].response["message"]

    def error_frame(self, p: Prepared) -> Any:
        return error_event

    def replay_body(self, req: MessagesRequest, rows: list[dict[str, Any]]) -> Any:
        return rows[0]["response"]["message"]

    def replay_frames(self, req: MessagesRequest, rows: list[dict[str, Any]]) -> list[bytes]:
        body, arguments = rows[0]["response"]["message"], rows[0]["response"].get("tool_arguments")
        start = {**body, "content": [], "stop_reason": None, "stop_sequence": None}
        choice = MessageChoice(start, self._signer(rows[0]["session_id"]))
        frames = choice.started()
        for block in body["content"]:
            if block["type"] == "tool_use":
                arguments_of = (arguments or {}).get(block["id"], "{}")
                frames += choice.tool_call(ToolCall(block["id"], block["name"], arguments_of))
            else:  # text or thinking, each a block of its own
                frames += choice.write(block["type"], block[block["type"]]) + choice.close()
        return frames + choice.done(recorded_answer(rows[0]))
