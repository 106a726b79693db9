"""Serving `POST /v1/responses` (the OpenAI Responses API, the Agents SDK's default).

A Responses request is turned into chat messages (protocol.to_messages) and served like
a chat completion (the same template, tool parser and template method), so it is
recorded like one (parent link included) under its response id, and rewarded by it.

`previous_response_id` names an earlier response of the caller's own session: its
input and output items are put before this request's input. The record is committed
before `response.completed`.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.concurrency import run_in_threadpool

from gateway.chat.events import ToolCall
from gateway.chat.tools import check_tool_choice
from gateway.entrypoints.openai.responses.events import ResponseChoice
from gateway.entrypoints.openai.responses.protocol import (
    ResponseContext,
    ResponsesRequest,
    chat_tools,
    input_items,
    to_messages,
)
from gateway.errors import APIError
from gateway.serving.endpoint import Choice, Prepared, ServingEndpoint
from gateway.serving.generate import Sampling
from gateway.serving.turn import Answer, ChoiceOutput, Turn, recorded_answer
from gateway.store.repository import SessionInfo


class ResponsesServing(ServingEndpoint[ResponsesRequest]):
    endpoint = "responses"
    history_field = "input"  # a list where an agent resends its history (the Agents SDK)
    FIELD = ("input", "invalid_input")  # what a prompt error names

    def validate(self, req: ResponsesRequest) -> None:
        check_tool_choice(req.tool_choice, chat_tools(req.tools))

    async def prepare(self, req: ResponsesRequest, session: SessionInfo) -> Prepared:
        tools = chat_tools(req.tools)
        items = input_items(req.input)
        if req.previous_response_id is not None:
            items = await self._previous_items(session.id, req.previous_response_id) + items
        messages = to_messages(items, req.instructions)
        prompt = await self.prompts.chat(session, messages, tools, req.tool_choice, self.FIELD)
        sampling = Sampling(req.max_output_tokens)
        turn = self.turn(req, session, prompt, [f"resp_{uuid.uuid4().hex}"], sampling)
        if req.previous_response_id is not None:
            turn.request["resolved_input"] = items  # what a later previous_response_id continues
        shape = ResponseContext(req, turn.ids[0], turn.params.temperature, turn.params.top_p)
        parser = self.generator.output_parser(
            prompt.text, bool(tools) and req.tool_choice != "none"
        )
        choice = ResponseChoice(shape.response("in_progress", []), parser, emit=req.stream)
        return Prepared(req, [turn], stream=req.stream, context={"shape": shape}, choice=choice)

    async def _previous_items(self, session_id: str, response_id: str) -> list[dict[str, Any]]:
        """The input and output items of an earlier response of this same session."""
        row = await run_in_threadpool(self.records.repo.completion, session_id, response_id)
        if row is None or row["endpoint"] != self.endpoint:
            raise APIError(
                404,
                f"No response {response_id!r} in this session.",
                code="previous_response_not_found",
                param="previous_response_id",
            )
        request, response = row["request"] or {}, row["response"] or {}
        previous = request.get("resolved_input") or input_items(request.get("input") or [])
        return [*previous, *(response.get("output") or [])]

    def finish(self, p: Prepared, turn: Turn, choice: Choice, out: ChoiceOutput) -> Answer:
        assert isinstance(choice, ResponseChoice)
        message = choice.message(out)
        calls = "tool_calls" in message
        finish = "tool_calls" if calls and out.finish_reason == "stop" else out.finish_reason
        status = "incomplete" if out.finish_reason == "length" else "completed"
        tokens = (len(turn.prompt_ids), len(out.output_ids))
        response = p.context["shape"].response(status, list(choice.blocks), tokens)
        return Answer(out, finish, response, turn.answer_hash(message), message)

    def response(self, p: Prepared, answers: list[Answer]) -> dict[str, Any]:
        return answers[0].response

    def error_frame(self, p: Prepared) -> Any:
        return p.choice.error  # type: ignore[union-attr] - (a ResponseChoice)

    def replay_frames(self, req: ResponsesRequest, rows: list[dict[str, Any]]) -> list[bytes]:
        response = rows[0]["response"]
        choice = ResponseChoice({**response, "status": "in_progress", "output": []})
        choice.recorded_ids = iter([item["id"] for item in response["output"]])
        frames = choice.started()
        for item in response["output"]:
            if item["type"] == "message":
                text = "".join(part.get("text", "") for part in item["content"])
                frames += choice.write("text", text) + choice.close()
            elif item["type"] == "reasoning":
                text = "".join(part["text"] for part in item.get("content") or [])
                frames += choice.write("reasoning", text) + choice.close()
            elif item["type"] == "function_call":
                call = ToolCall(item["call_id"], item["name"], item["arguments"])
                frames += choice.tool_call(call)
        return frames + choice.done(recorded_answer(rows[0]))
