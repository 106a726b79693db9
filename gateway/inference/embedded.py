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
import os
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
    chunks: asyncio.Queue[TokenChunk | None] | None = None  # a stream's; None: settled
    submitted: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] | None = None
    started: float = 0.0
    cancelled: bool = False
    finished: bool = False


class EmbeddedEngine(InferenceEngine):
    name = "embedded"

    def __init__(
        self,
        model: str | Path | None = None,
        device: str = "cpu",
        max_batch_size: int = 32,
        share_prefix: bool = True,
    ) -> None:
        self.model_spec = model
        self.device = device
        self.max_batch_size = max_batch_size
        self.batch_wait_s = 0.005  # how long a wave waits for requests arriving with it
        self.share_prefix = share_prefix
        self.model_dir: Path | None = None
        self.model: torch.nn.Module | None = None
        self._version = 0
        self._weights_lock = threading.Lock()
        self._pending: queue.Queue[_Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.prefix_tokens_shared = 0  # prompt tokens taken from a shared prefix, not prefilled
        self._prefix_kv: (
            tuple[int, tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] | None
        ) = None
        self.waves = 0  # batches run so far (requests that arrived together share one)

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        if self.model is None:
            self.model_dir = await asyncio.to_thread(resolve_model_dir, self.model_spec)
            model = await asyncio.to_thread(load_causal_lm, self.model_dir, self.device)
            self.model = model.eval()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._worker, name="embedded-engine", daemon=True
            )
            self._thread.start()

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
        if self.model is None:
            return 2048
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    async def health(self) -> bool:
        return self.model is not None and bool(self._thread and self._thread.is_alive())

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
        state_dict = await asyncio.to_thread(lambda: load_causal_lm(Path(path)).state_dict())
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
        try:
            while (chunk := await req.chunks.get()) is not None:
                yield chunk
            yield req.future.result()
        finally:
            if not req.future.done():
                req.cancelled = True  # the caller went away: the row stops at the next step

    def _submit(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> _Request:
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
        while (first := self._pending.get()) is not None:
            wave = [first] if not first.cancelled else []
            wave += self._take(self.max_batch_size - len(wave), self.batch_wait_s)
            if not wave:
                continue
            self.waves += 1
            seen = list(wave)
            try:
                self._decode(wave, seen)
            except Exception as exc:  # keep serving: fail this batch only, joined rows too
                log.exception("embedded engine wave failed")
                for r in seen:
                    self._finish(r, exc)

    def _take(self, room: int, wait_s: float = 0.0) -> list[_Request]:
        """Up to `room` requests waiting now or arriving within `wait_s`: the rest of a
        new wave, or those joining a running batch at its next step."""
        taken: list[_Request] = []
        deadline = time.perf_counter() + wait_s
        while len(taken) < room:
            try:
                nxt = self._pending.get(timeout=max(deadline - time.perf_counter(), 0))
            except queue.Empty:
                break
            if nxt is None:
                self._pending.put(None)  # shut down once this batch is done
                break
            if not nxt.cancelled:
                taken.append(nxt)
        return taken

    def _shared_prefix(self, reqs: list[_Request]) -> int:
        """How many leading prompt tokens the batch can take from one shared prefill.

        Agents send one system prompt (often kilobytes) with every request; computing
        its keys and values once per batch, not once per row, is most of a batch's
        prefill. The last cached prefix is reused while the policy version holds.
        Every row keeps at least one token of its own, for its logits.
        """
        shortest = min(len(r.prompt_ids) for r in reqs) - 1
        cached = self._prefix_kv
        if cached is not None and cached[0] == self._version:
            prefix = cached[1]
            if len(prefix) <= shortest and all(
                r.prompt_ids[: len(prefix)] == list(prefix) for r in reqs
            ):
                return len(prefix)
        if len(reqs) < 2:
            return 0
        # (commonprefix compares any sequences, lists of ids too, element by element)
        n = min(len(os.path.commonprefix([r.prompt_ids for r in reqs])), shortest)
        return n if n >= SHARED_PREFIX_MIN else 0

    def _prefix_cache(self, prefix: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values of `prefix` (one row) under the current weights."""
        from transformers import DynamicCache

        cached = self._prefix_kv
        if cached is not None and cached[0] == self._version and cached[1] == prefix:
            return cached[2]
        assert self.model is not None
        cache = DynamicCache()
        self.model(
            input_ids=torch.tensor([prefix], device=self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        self._prefix_kv = (self._version, prefix, kv)
        return kv

    def _prefill(self, reqs: list[_Request]) -> tuple[_Rows, torch.Tensor]:
        """Left-padded prompts through the model: their rows and last-position logits.

        Called with the weights lock held, so every row starts at one policy version.
        A shared prefix is computed once; each row's own part follows it, left-padded,
        so a row reads [prefix][padding][own tokens] with the padding masked out.
        """
        from transformers import DynamicCache

        model = self.model
        assert model is not None
        batch = len(reqs)
        shared = self._shared_prefix(reqs) if self.share_prefix and _plain_layers(model) else 0
        if shared:
            kv = self._prefix_cache(tuple(reqs[0].prompt_ids[:shared]))
            cache = DynamicCache(
                ddp_cache_data=[
                    (
                        k.expand(batch, -1, -1, -1).contiguous(),
                        v.expand(batch, -1, -1, -1).contiguous(),
                    )
                    for k, v in kv
                ]
            )
        else:
            cache = DynamicCache()
        own = [r.prompt_ids[shared:] for r in reqs]
        lens = [len(ids) for ids in own]
        width = max(lens)
        input_ids = torch.zeros((batch, width), dtype=torch.long)
        own_attn = torch.zeros((batch, width), dtype=torch.long)
        for i, ids in enumerate(own):
            input_ids[i, width - lens[i] :] = torch.tensor(ids)
            own_attn[i, width - lens[i] :] = 1
        position_ids = (shared + own_attn.cumsum(-1) - 1).clamp(min=0)
        attn = torch.cat([torch.ones((batch, shared), dtype=torch.long), own_attn], dim=1)
        input_ids, attn, position_ids = (t.to(self.device) for t in (input_ids, attn, position_ids))
        out = model(
            input_ids=input_ids,
            attention_mask=attn,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.prefix_tokens_shared += shared * batch
        now = time.perf_counter()
        for r in reqs:
            r.started = now
            if r.params.top_logprobs > 0:
                r.top_logprobs = []
        rows = _Rows(
            reqs=list(reqs),
            cache=cache,
            attn=attn,
            next_pos=position_ids[:, -1:] + 1,
            temps=torch.tensor(
                [r.params.temperature for r in reqs], dtype=torch.float32, device=self.device
            ),
            top_ps=torch.tensor(
                [r.params.top_p for r in reqs], dtype=torch.float32, device=self.device
            ),
            generators=[
                None
                if r.params.seed is None
                else torch.Generator(self.device).manual_seed(int(r.params.seed))
                for r in reqs
            ],
        )
        return rows, out.logits[:, -1, :].float()

    @torch.inference_mode()
    def _decode(self, wave: list[_Request], seen: list[_Request]) -> None:
        """Decode a batch until its last row finishes (continuous batching); `seen`
        keeps its unfinished rows, for the caller to fail if a step raises.

        Requests that arrive meanwhile are prefilled and join the running batch between
        two decode steps, rather than waiting for the slowest row of the batch to finish:
        agents' turns arrive staggered, and a whole wave waiting for its longest answer
        left most of the batch idle.
        """
        model = self.model
        assert model is not None
        with self._weights_lock:
            version = self._version
            rows, logits = self._prefill(wave)
        versions = [version] * len(rows.reqs)

        while True:
            # the behaviour policy is the temperature-scaled one (greedy rows: raw logits)
            temps = rows.temps
            logprobs = torch.log_softmax(
                logits / torch.where(temps > 0, temps, 1.0)[:, None], dim=-1
            )
            tokens = _sample(logits, temps, rows.top_ps, rows.generators)
            chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
            tok_list = tokens.tolist()
            lp_list = chosen.tolist()
            want_top = max(max(0, int(r.params.top_logprobs)) for r in rows.reqs)
            if want_top:
                top_vals, top_ids = logprobs.topk(want_top, dim=-1)
                top_vals_l, top_ids_l = top_vals.tolist(), top_ids.tolist()
            keep: list[int] = []
            for row, r in enumerate(rows.reqs):
                if r.cancelled:
                    self._finish(r, None, "abort")
                    continue
                tok = tok_list[row]
                r.output_ids.append(tok)
                r.logprobs.append(lp_list[row])
                r.versions.append(versions[row])
                alts: TopLogprobs | None = None
                if r.top_logprobs is not None:
                    k = max(0, int(r.params.top_logprobs))
                    alts = list(zip(top_ids_l[row][:k], top_vals_l[row][:k], strict=True))
                    r.top_logprobs.append(alts)
                if r.chunks is not None:
                    chunk = TokenChunk(
                        [tok], [lp_list[row]], [versions[row]], None if alts is None else [alts]
                    )
                    r.loop.call_soon_threadsafe(r.chunks.put_nowait, chunk)
                if tok in r.params.stop_token_ids:
                    self._finish(r, None, "stop")
                elif len(r.output_ids) >= r.params.max_new_tokens:
                    self._finish(r, None, "length")
                else:
                    keep.append(row)
            joined = self._take(self.max_batch_size - len(keep)) if rows.mergeable() else []
            seen[:] = [r for r in seen if not r.finished] + joined  # bounded by the batch
            if not keep and not joined:
                return
            with self._weights_lock:
                version = self._version
                parts: list[tuple[_Rows, torch.Tensor]] = []
                if keep:
                    rows.select(keep, device=self.device)
                    step = tokens[torch.tensor(keep, device=self.device)]
                    rows.attn = torch.cat([rows.attn, rows.attn.new_ones((len(keep), 1))], dim=1)
                    out = model(
                        input_ids=step[:, None],
                        attention_mask=rows.attn,
                        position_ids=rows.next_pos,
                        past_key_values=rows.cache,
                        use_cache=True,
                    )
                    rows.next_pos = rows.next_pos + 1
                    parts.append((rows, out.logits[:, -1, :].float()))
                if joined:
                    parts.append(self._prefill(joined))
            rows, logits = parts[0]
            for more, more_logits in parts[1:]:
                rows.extend(more)
                logits = torch.cat([logits, more_logits])
            versions = [version] * len(rows.reqs)

    def _finish(self, r: _Request, exc: BaseException | None, reason: str = "stop") -> None:
        if r.future.done():
            return
        r.finished = True
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
            if r.chunks is not None:
                r.chunks.put_nowait(None)  # after its every chunk: the stream reads the end

        r.loop.call_soon_threadsafe(settle)


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


SHARED_PREFIX_MIN = 16  # shorter common prefixes are not worth a separate forward


def _plain_layers(model: torch.nn.Module) -> bool:
    """Only full-attention models: sliding-window caches cannot take a padded middle."""
    config = getattr(model, "config", None)
    layer_types = getattr(config, "layer_types", None) or []
    return not getattr(config, "sliding_window", None) and all(
        t == "full_attention" for t in layer_types
    )


@dataclass(eq=False)
class _Rows:
    """The decoding state of a batch, one row per request, left-padded to one width."""

    reqs: list[_Request]
    cache: object  # transformers DynamicCache
    attn: torch.Tensor  # (rows, width): 0 over each row's left padding
    next_pos: torch.Tensor  # (rows, 1): each row's next position id
    temps: torch.Tensor
    top_ps: torch.Tensor
    generators: list[torch.Generator | None]

    def mergeable(self) -> bool:
        """Rows can join only where every cache layer is a plain growing K/V pair."""
        from transformers.cache_utils import DynamicLayer

        layers = getattr(self.cache, "layers", None)
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

    def select(self, keep: list[int], device: str) -> None:
        """Drop finished rows, then the left columns that are padding in every row left."""
        if len(keep) < len(self.reqs):
            idx = torch.tensor(keep, device=device)
            self.cache.batch_select_indices(idx)
            self.attn, self.next_pos = self.attn[idx], self.next_pos[idx]
            self.temps, self.top_ps = self.temps[idx], self.top_ps[idx]
            self.generators = [self.generators[k] for k in keep]
            self.reqs = [self.reqs[k] for k in keep]
        pad = int((self.attn.sum(0) == 0).long().cumprod(0).sum())
        if pad and self.mergeable():
            self.attn = self.attn[:, pad:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., pad:, :], layer.values[..., pad:, :]

    def extend(self, other: _Rows) -> None:
        """Append another batch's rows, left-padding the narrower one's cache and mask."""
        width = max(self.attn.shape[1], other.attn.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, width), _left_pad(theirs.keys, width)])
            mine.values = torch.cat(
                [_left_pad(mine.values, width), _left_pad(theirs.values, width)]
            )
        self.attn = torch.cat(
            [_left_pad(self.attn, width, dim=-1), _left_pad(other.attn, width, dim=-1)]
        )
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.temps = torch.cat([self.temps, other.temps])
        self.top_ps = torch.cat([self.top_ps, other.top_ps])
        self.generators += other.generators
        self.reqs += other.reqs


def _left_pad(t: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    """Zeros on the left of `dim` (-1 or -2) up to `width` (masked out by the attention
    mask)."""
    return torch.nn.functional.pad(t, [0, 0] * (-dim - 1) + [width - t.shape[dim], 0])
