"""`RolloutEngine`: token-level generation for workflows, straight from the engine.

Token-level workflows (`RolloutWorkflow.arun_episode`) and queue agents skip the OpenAI
API: they hold token ids already and want the output tokens, behaviour logprobs and
policy versions back. This wraps any `gateway.inference.base.InferenceEngine`; built
with `for_gateway`, it also records every generation in the gateway's store, in the
episode's session, before returning it (their samples come from there).

An engine's `generate` is a coroutine that must run on the engine's home event loop
(the embedded engine resolves its futures there). In the trainer the engine lives on the
gateway's background thread, while workflows run on the trainer's loop: pass that home
loop as `loop` and each call is handed over to it (and cancelled there if the caller is
cancelled).
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import TYPE_CHECKING, Any

from gateway.inference.base import ContextLengthExceeded, InferenceEngine
from trainer.api.io_struct import LLMRequest, LLMResponse

if TYPE_CHECKING:
    from gateway.serving.direct import DirectRecorder

__all__ = [
    "ContextTooLongError",
    "EmptyPromptError",
    "GenerationError",
    "RolloutEngine",
]


class GenerationError(RuntimeError):
    """The engine could not serve a workflow's request."""


class EmptyPromptError(GenerationError, ValueError):
    pass


class ContextTooLongError(GenerationError, ValueError):
    def __init__(self, message: str, prompt_tokens: int, max_context: int) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context


class RolloutEngine:
    """`await engine.agenerate(LLMRequest(...)) -> LLMResponse`, one completion per call.

    - `engine`: the inference engine (embedded, sglang, fake, ...).
    - `loop`: the engine's home event loop, when it is not the caller's (see module doc).
    - `default_stop_token_ids`: used for requests whose gconfig names no stop tokens
      (engines stop only on the ids they are given; e.g. the chat template's end token).
    - `recorder`: where each generation is committed before it is returned (the
      gateway's store, one session per episode: `open_episode` / `close_episode`).
    """

    def __init__(
        self,
        engine: InferenceEngine,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        default_stop_token_ids: list[int] | None = None,
        recorder: DirectRecorder | None = None,
    ) -> None:
        self.engine = engine
        self.loop = loop
        self.default_stop_token_ids = [int(t) for t in default_stop_token_ids or []]
        self.recorder = recorder
        self.session_id: str | None = None  # the episode's session, when recording
        self.num_requests = 0  # agenerate calls made through this object

    @property
    def version(self) -> int:
        """The policy version the engine is serving now."""
        return int(self.engine.version)

    @property
    def max_context(self) -> int:
        return int(self.engine.max_context)

    def fork(self) -> RolloutEngine:
        """The same engine with its own request counter (one per episode)."""
        child = copy.copy(self)
        child.session_id = None
        child.num_requests = 0
        return child

    @classmethod
    def for_gateway(cls, gateway: Any, model: str = "default") -> RolloutEngine:
        """The engine of a running `gateway.server.BackgroundGateway`, recording into its
        store, and stopping at the chat template's end tokens unless a request's gconfig
        names its own (as the gateway and SGLang do)."""
        from gateway.serving.direct import DirectRecorder

        state = gateway.state
        recorder = DirectRecorder(state.repo, state.recorder, model, state.config.session_ttl_s)
        return cls(
            gateway.engine,
            gateway.loop,
            default_stop_token_ids=state.renderer.stop_token_ids,
            recorder=recorder,
        )

    async def open_episode(self, meta: dict[str, Any]) -> str:
        """Start this (forked) engine's session in the store; its id."""
        if self.recorder is None:
            raise GenerationError("this engine records nowhere: it has no recorder")
        self.session_id = await self.recorder.open_session(meta)
        return self.session_id

    async def close_episode(self) -> None:
        if self.recorder is not None and self.session_id is not None:
            await self.recorder.end_session(self.session_id)

    async def agenerate(self, req: LLMRequest) -> LLMResponse:
        prompt = [int(t) for t in req.input_ids]
        if not prompt:
            raise EmptyPromptError(f"request {req.rid}: input_ids is empty")
        gconfig = req.gconfig
        try:
            max_new = self.engine.check_fits(len(prompt), gconfig.max_new_tokens)
        except ContextLengthExceeded as exc:
            raise ContextTooLongError(
                f"request {req.rid}: the prompt has {exc.prompt_tokens} tokens, which leaves "
                f"no room to generate within the model's context of {exc.max_context} tokens",
                exc.prompt_tokens,
                exc.max_context,
            ) from exc
        params = gconfig.to_sampling_params(max_new)
        if not params.stop_token_ids:
            params.stop_token_ids = list(self.default_stop_token_ids)
        self.num_requests += 1
        started = time.perf_counter()
        try:
            result = await self._on_engine_loop(
                self.engine.generate(prompt, params, route_key=req.rid)
            )
        except ContextLengthExceeded as exc:
            raise ContextTooLongError(
                f"request {req.rid}: {exc}", exc.prompt_tokens, exc.max_context
            ) from exc
        except GenerationError:
            raise
        except Exception as exc:
            raise GenerationError(
                f"request {req.rid}: engine {self.engine.name!r} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        n = len(result.output_ids)
        if len(result.logprobs) != n or len(result.versions) != n:
            raise GenerationError(
                f"request {req.rid}: engine returned {n} tokens but {len(result.logprobs)} "
                f"logprobs and {len(result.versions)} versions"
            )
        if self.recorder is not None and self.session_id is not None:
            await self.recorder.record(
                self.session_id, prompt, result, params, req.rid, time.perf_counter() - started
            )
        return LLMResponse(
            input_tokens=prompt,
            output_tokens=list(result.output_ids),
            output_logprobs=[float(x) for x in result.logprobs],
            output_versions=[int(v) for v in result.versions],
            stop_reason=str(result.finish_reason),
            latency=time.perf_counter() - started,
        )

    async def _on_engine_loop(self, coro):  # type: ignore[no-untyped-def]
        home = self.loop
        if home is None or home is asyncio.get_running_loop():
            return await coro
        if home.is_closed() or not home.is_running():
            coro.close()
            raise GenerationError("the engine's event loop is not running")
        future = asyncio.run_coroutine_threadsafe(coro, home)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # stop the generation on the engine's loop too
            raise
