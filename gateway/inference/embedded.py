"""In-process Hugging Face engine: the default, so a fresh machine needs no server.

Requests that arrive together are decoded together in one batch ("waves"): the
decode loop below is ours rather than `model.generate` because RL needs things
`generate` does not give per request: its own temperature/top_p/seed/stop ids,
raw-policy logprobs of every sampled token, and the policy version of every token
even when new weights land between two decode steps.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gateway.inference.base import (
    EngineError,
    GenerationResult,
    InferenceEngine,
    SamplingParams,
    TokenChunk,
    TopLogprobs,
    WeightUpdate,
)
from gateway.inference.model_source import load_causal_lm, resolve_model_dir

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[GenerationResult]
    chunks: asyncio.Queue[TokenChunk] | None = None
    submitted: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] | None = None
    started: float = 0.0
    cancelled: bool = False


class EmbeddedEngine(InferenceEngine):
    name = "embedded"

    def __init__(
        self,
        model: str | Path | None = None,
        device: str = "cpu",
        max_batch_size: int = 32,
        batch_wait_s: float = 0.005,
        max_context: int | None = None,
    ) -> None:
        self.model_spec = model
        self.device = device
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self._max_context_override = max_context
        self.model_dir: Path | None = None
        self.model: torch.nn.Module | None = None
        self._version = 0
        self._weights_lock = threading.Lock()
        self._pending: queue.Queue[_Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self.tokens_generated = 0
        self.waves = 0  # batches run so far (requests that arrived together share one)

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        if self.model is None:
            await asyncio.to_thread(self.load)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._worker, name="embedded-engine", daemon=True
            )
            self._thread.start()

    def load(self) -> None:
        self.model_dir = resolve_model_dir(self.model_spec)
        model = load_causal_lm(self.model_dir, self.device)
        model.eval()
        self.model = model

    async def close(self) -> None:
        if self._thread is not None:
            self._pending.put(None)
            await asyncio.to_thread(self._thread.join, 10)
            self._thread = None

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        if self._max_context_override:
            return self._max_context_override
        if self.model is None:
            return 2048
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    async def health(self) -> bool:
        return (
            self.model is not None
            and self._dead is None
            and bool(self._thread and self._thread.is_alive())
        )

    # ---- weights ---------------------------------------------------------------------
    async def update_weights(self, update: WeightUpdate) -> int:
        if update.state_dict is None:
            return await super().update_weights(update)
        return await asyncio.to_thread(self.load_state_dict, update.state_dict, update.version)

    def load_state_dict(
        self, state_dict: Mapping[str, torch.Tensor], version: int | None = None
    ) -> int:
        """Load new weights between two decode steps; returns the new policy version.

        Thread-safe: the trainer calls this from its own thread.
        """
        if self.model is None:
            raise EngineError("engine not started")
        with self._weights_lock:
            with torch.no_grad():
                missing, unexpected = self.model.load_state_dict(dict(state_dict), strict=False)
            missing = [k for k in missing if not k.endswith("lm_head.weight")]
            if missing or unexpected:
                raise EngineError(
                    f"weight update mismatch: missing={missing[:3]} unexpected={unexpected[:3]}"
                )
            self._version = self._version + 1 if version is None else version
            return self._version

    async def update_weights_from_disk(self, path: str | Path, version: int | None = None) -> int:
        """Load a saved checkpoint (off the event loop), then swap it in between steps."""
        if self.model is None:
            raise EngineError("engine not started")

        def load() -> dict[str, torch.Tensor]:
            from transformers import AutoModelForCausalLM

            fresh = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            return fresh.state_dict()

        state_dict = await asyncio.to_thread(load)
        return await asyncio.to_thread(self.load_state_dict, state_dict, version)

    # ---- requests --------------------------------------------------------------------
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, route_key: str | None = None
    ) -> GenerationResult:
        req = self._submit(prompt_ids, params, stream=False)
        try:
            return await asyncio.shield(req.future)
        except asyncio.CancelledError:
            req.cancelled = True
            raise

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams, *, route_key: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        req = self._submit(prompt_ids, params, stream=True)
        assert req.chunks is not None
        getter: asyncio.Future[TokenChunk] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(req.chunks.get())
                done, _ = await asyncio.wait(
                    {getter, req.future}, return_when=asyncio.FIRST_COMPLETED
                )
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                while not req.chunks.empty():
                    yield req.chunks.get_nowait()
                yield req.future.result()
                return
        finally:
            if getter is not None and not getter.done():
                getter.cancel()  # we were cancelled while waiting for a token
            if not req.future.done():
                req.cancelled = True

    def _submit(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> _Request:
        if self._dead is not None:
            raise EngineError(f"embedded engine died: {self._dead!r}")
        if self.model is None or self._thread is None:
            raise EngineError("embedded engine is not started")
        if not prompt_ids:
            raise ValueError("prompt must contain at least one token")
        loop = asyncio.get_running_loop()
        req = _Request(
            prompt_ids=list(prompt_ids),
            params=params,
            loop=loop,
            future=loop.create_future(),
            chunks=asyncio.Queue() if stream else None,
        )
        self._pending.put(req)
        return req

    # ---- worker thread ---------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            first = self._pending.get()
            if first is None:
                return
            wave = [first]
            deadline = time.perf_counter() + self.batch_wait_s
            while len(wave) < self.max_batch_size:
                timeout = deadline - time.perf_counter()
                try:
                    nxt = (
                        self._pending.get(timeout=max(timeout, 0))
                        if timeout > 0
                        else self._pending.get_nowait()
                    )
                except queue.Empty:
                    break
                if nxt is None:
                    self._pending.put(None)
                    break
                wave.append(nxt)
            wave = [r for r in wave if not r.cancelled]
            if not wave:
                continue
            try:
                self._run_wave(wave)
            except Exception as exc:  # keep serving: fail this wave only
                log.exception("embedded engine wave failed")
                for r in wave:
                    self._finish(r, exc)

    @torch.inference_mode()
    def _run_wave(self, wave: list[_Request]) -> None:
        self.waves += 1
        model = self.model
        assert model is not None
        from transformers import DynamicCache

        device = self.device
        pad_id = 0
        lens = [len(r.prompt_ids) for r in wave]
        width = max(lens)
        batch = len(wave)
        input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
        attn = torch.zeros((batch, width), dtype=torch.long)
        for i, r in enumerate(wave):
            input_ids[i, width - lens[i] :] = torch.tensor(r.prompt_ids)
            attn[i, width - lens[i] :] = 1
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        input_ids, attn, position_ids = (
            input_ids.to(device),
            attn.to(device),
            position_ids.to(device),
        )

        temps = torch.tensor(
            [r.params.temperature for r in wave], dtype=torch.float32, device=device
        )
        top_ps = torch.tensor([r.params.top_p for r in wave], dtype=torch.float32, device=device)
        generators = [_generator_for(r.params.seed, device) for r in wave]
        stops = [set(r.params.stop_token_ids) for r in wave]
        tops = [max(0, int(r.params.top_logprobs)) for r in wave]
        now = time.perf_counter()
        for r, top in zip(wave, tops, strict=True):
            r.started = now
            if top:
                r.top_logprobs = []

        active = list(range(batch))  # row -> index into `wave`
        cache = DynamicCache()
        with self._weights_lock:
            version = self._version
            out = model(
                input_ids=input_ids,
                attention_mask=attn,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        logits = out.logits[:, -1, :].float()
        next_pos = position_ids[:, -1:] + 1

        while True:
            # the behaviour policy is the temperature-scaled one (greedy rows: raw logits)
            logprobs = torch.log_softmax(
                logits / torch.where(temps > 0, temps, 1.0)[:, None], dim=-1
            )
            tokens = _sample(logits, temps, top_ps, generators)
            chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
            tok_list = tokens.tolist()
            lp_list = chosen.tolist()
            want_top = max(tops[widx] for widx in active)
            if want_top:
                top_vals, top_ids = logprobs.topk(want_top, dim=-1)
                top_vals_l, top_ids_l = top_vals.tolist(), top_ids.tolist()
            keep: list[int] = []
            for row, widx in enumerate(active):
                r = wave[widx]
                if r.cancelled:
                    self._finish(r, None, "abort")
                    continue
                tok = tok_list[row]
                r.output_ids.append(tok)
                r.logprobs.append(lp_list[row])
                r.versions.append(version)
                alts: TopLogprobs | None = None
                if r.top_logprobs is not None:
                    k = tops[widx]
                    alts = list(zip(top_ids_l[row][:k], top_vals_l[row][:k], strict=True))
                    r.top_logprobs.append(alts)
                if r.chunks is not None:
                    chunk = TokenChunk(
                        [tok], [lp_list[row]], [version], None if alts is None else [alts]
                    )
                    r.loop.call_soon_threadsafe(r.chunks.put_nowait, chunk)
                if tok in stops[widx]:
                    self._finish(r, None, "stop")
                elif len(r.output_ids) >= r.params.max_new_tokens:
                    self._finish(r, None, "length")
                else:
                    keep.append(row)
            self.tokens_generated += len(active)
            if not keep:
                return
            if len(keep) < len(active):
                idx = torch.tensor(keep, device=device)
                cache.batch_select_indices(idx)
                attn = attn[idx]
                next_pos = next_pos[idx]
                tokens = tokens[idx]
                temps, top_ps = temps[idx], top_ps[idx]
                generators = [generators[k] for k in keep]
                active = [active[k] for k in keep]
            attn = torch.cat([attn, attn.new_ones((len(active), 1))], dim=1)
            with self._weights_lock:
                version = self._version
                out = model(
                    input_ids=tokens[:, None],
                    attention_mask=attn,
                    position_ids=next_pos,
                    past_key_values=cache,
                    use_cache=True,
                )
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1

    def _finish(self, r: _Request, exc: BaseException | None, reason: str = "stop") -> None:
        if r.future.done():
            return
        end = time.perf_counter()

        def settle() -> None:
            if r.future.done():
                return
            if exc is not None:
                r.future.set_exception(EngineError(f"generation failed: {exc}"))
            else:
                r.future.set_result(
                    GenerationResult(
                        output_ids=r.output_ids,
                        logprobs=r.logprobs,
                        versions=r.versions,
                        finish_reason=reason,  # type: ignore[arg-type]
                        queue_s=(r.started or end) - r.submitted,
                        gen_s=end - (r.started or end),
                        top_logprobs=r.top_logprobs,
                    )
                )

        r.loop.call_soon_threadsafe(settle)


def _generator_for(seed: int | None, device: str) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def _sample(
    logits: torch.Tensor,
    temps: torch.Tensor,
    top_ps: torch.Tensor,
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """Per-row temperature / top-p sampling; temperature 0 means greedy."""
    greedy = temps <= 0
    scaled = logits / temps.clamp(min=1e-5)[:, None]
    probs = torch.softmax(scaled, dim=-1)
    if bool((top_ps < 1.0).any()):
        sorted_p, sorted_idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = (cum - sorted_p) > top_ps[:, None]
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(1, sorted_idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    if all(g is None for g in generators):
        sampled = torch.multinomial(probs, 1).squeeze(1)
    else:
        sampled = torch.stack(
            [
                torch.multinomial(probs[i], 1, generator=g).squeeze(0)
                for i, g in enumerate(generators)
            ]
        )
    return torch.where(greedy, logits.argmax(-1), sampled)
