"""Serving `POST /v1/chat/completions`: messages and tools in, choices (or chunks) out.

Only the chat-specific steps of the template (gateway/serving/endpoint.py): render the
messages with the model's chat template, parse tool calls out of the answer, and the
`ChatCompletion` / chunk shapes (protocol.py).
"""

from __future__ import annotations

from typing import Any

from gateway.chat.events import (
    ContentEvent,
    Event,
    ReasoningEvent,
    ToolCall,
    ToolCallEvent,
)
from gateway.chat.output_parser import OutputParser
from gateway.chat.tools import check_tool_choice
from gateway.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatShapes,
    ChunkWriter,
)
from gateway.serving.endpoint import Choice, Prepared, ServingEndpoint, Stages
from gateway.serving.generate import Sampling
from gateway.serving.turn import (
    Answer,
    ChoiceOutput,
    TextDelta,
    Turn,
    choice_ids,
    recorded_answer,
)
from gateway.store.repository import SessionInfo


class ChatChoice(Choice):
    def __init__(self, index: int, p: Prepared, parser: OutputParser | None) -> None:
        super().__init__(index, parser, p.stream)
        self.writer: ChunkWriter = p.context.get("writer")  # (frames are asked of a stream only)

    def frames(self, events: list[Event], delta: TextDelta | None) -> list[bytes]:
        return self.writer.events(self.index, events, delta)

    def done(self, answer: Answer) -> list[bytes]:
        return [self.writer.finish(self.index, answer.finish_reason)]


class ChatCompletionServing(ServingEndpoint[ChatCompletionRequest]):
    endpoint = "chat.completions"
    history_field = "messages"
    FIELD = ("messages", "invalid_messages")  # what a prompt error names

    def __init__(self, stages: Stages) -> None:
        super().__init__(stages)
        self.shapes = ChatShapes(self.prompts.renderer.tokenizer)

    def validate(self, req: ChatCompletionRequest) -> None:
        check_tool_choice(req.tool_choice, req.tools)

    def num_choices(self, req: ChatCompletionRequest) -> int:
        return req.n

    async def prepare(self, req: ChatCompletionRequest, session: SessionInfo) -> Prepared:
        messages, tools = req.messages, req.tools
        prompt = await self.prompts.chat(session, messages, tools, req.tool_choice, self.FIELD)
        top_logprobs = (req.top_logprobs or 0) if req.logprobs else 0
        max_tokens = req.max_completion_tokens or req.max_tokens
        sampling = Sampling(max_tokens, top_logprobs, req.stop_strings())
        turn = self.turn(req, session, prompt, choice_ids("chatcmpl", req.n), sampling)
        p = Prepared(req, [turn], per_turn=req.n, stream=req.stream)
        if req.stream:
            p.context["writer"] = ChunkWriter(req, turn.ids[0], self.shapes)
        return p

    def new_choice(self, p: Prepared, turn: Turn, index: int) -> Choice:
        may_call = bool(p.req.tools) and p.req.tool_choice != "none"
        parser = self.generator.output_parser(turn.prompt.text, may_call)
        return ChatChoice(index, p, parser)

    def finish(self, p: Prepared, turn: Turn, choice: Choice, out: ChoiceOutput) -> Answer:
        message, finish = choice.message(out), out.finish_reason
        if "tool_calls" in message and finish == "stop":
            finish = "tool_calls"
        answer_hash = turn.answer_hash(message)
        return Answer(out, finish, {"message": message}, answer_hash, message)

    def response(self, p: Prepared, answers: list[Answer]) -> dict[str, Any]:
        turn = p.turns[0]
        return self.shapes.completion(p.req, turn.ids[0], len(turn.prompt_ids), answers)

    def stream_end(self, p: Prepared, answers: list[Answer]) -> list[bytes]:
        completion_tokens = sum(len(a.out.output_ids) for a in answers)
        return p.context["writer"].closing(len(p.turns[0].prompt_ids), completion_tokens)

    def replay_body(self, req: ChatCompletionRequest, rows: list[dict[str, Any]]) -> Any:
        answers = [recorded_answer(r) for r in rows]
        return self.shapes.completion(req, rows[0]["id"], rows[0]["prompt_tokens"], answers)

    def replay_frames(self, req: ChatCompletionRequest, rows: list[dict[str, Any]]) -> list[bytes]:
        writer = ChunkWriter(req, rows[0]["id"], self.shapes)
        frames: list[bytes] = []
        for a in map(recorded_answer, rows):
            message = a.message or {}
            events: list[Event] = []
            if message.get("reasoning_content"):
                events.append(ReasoningEvent(message["reasoning_content"]))
            if message.get("content"):
                events.append(ContentEvent(message["content"]))
            for i, tc in enumerate(message.get("tool_calls") or []):
                fn = tc["function"]
                events.append(ToolCallEvent(i, ToolCall(tc["id"], fn["name"], fn["arguments"])))
            delta = TextDelta("", a.out.output_ids, a.out.logprobs, None)
            frames += writer.events(a.out.index, events, delta)
            frames.append(writer.finish(a.out.index, a.finish_reason))
        completion_tokens = sum(len(r["output_ids"]) for r in rows)
        return frames + writer.closing(rows[0]["prompt_tokens"], completion_tokens)
