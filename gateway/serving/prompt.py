"""Stage 1 of a request, the prompt (`Prompts.chat` -> `Prompt`): link (the earlier turn
it continues: answers this process gave are kept in memory, the rest asked of the
store), render (on the parent's tokens where provable; where not, why: drift), prompt
mode (`template`, or `token_exact`: the parent's ids + only the new messages).

Once a choice is recorded, `remember` keeps its answer for the turn that continues it.
"""

from __future__ import annotations

import asyncio
import operator
from dataclasses import replace
from typing import Any

from gateway.chat.drift import drift
from gateway.chat.families import make_tool_parser
from gateway.chat.linking import ConversationHash, answer_positions, framed, last_answer
from gateway.chat.template import ChatRenderer, Rendered
from gateway.config import PROMPT_MODES, GatewayConfig
from gateway.errors import APIError
from gateway.lru import LRU
from gateway.metrics import Metrics
from gateway.serving.turn import ChoiceOutput, Link, Parent, Prompt, Turn
from gateway.store.delta import continued_length
from gateway.store.repository import Repository, SessionInfo

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None
_session = operator.itemgetter(0)  # the session id of a (session id, ...) cache key


class Prompts:
    def __init__(
        self,
        renderer: ChatRenderer,
        repo: Repository,
        metrics: Metrics,
        config: GatewayConfig,
        tool_parser: str,
    ) -> None:
        """`tool_parser`: the model's tool-call format (a parent's calls explain drift)."""
        self.renderer, self.repo, self.metrics = renderer, repo, metrics
        self.tool_parser = tool_parser
        if config.prompt_mode not in PROMPT_MODES:
            raise ValueError(f"prompt_mode {config.prompt_mode!r}: one of {PROMPT_MODES}")
        self.prompt_mode = config.prompt_mode
        self.max_n = config.max_n
        # (session id, answer hash) -> parent; saves a DB read per turn. Its request's
        # history is frozen (gateway/frozen.py), its prompt ids a TokenIds where rendered;
        # the rest (request fields, output ids) is only read, by convention.
        self.recent: LRU[tuple[str, str], Parent] = LRU(
            config.parent_cache_size,
            max_weight=config.parent_cache_tokens,
            weigh=lambda p: len(p.prompt_ids) + len(p.output_ids),
            group=_session,
        )
        # (session id, messages before the answer) -> the answers' hashes, newest last:
        # where a request's conversation hash resumes from (`_link`)
        self._answered: LRU[tuple[str, int], tuple[str, ...]] = LRU(
            config.parent_cache_size, group=_session
        )

    async def chat(
        self,
        session: SessionInfo,
        messages: Messages,
        tools: Tools,
        tool_choice: Any,
        field: tuple[str, str],
    ) -> Prompt:
        """The prompt of a chat request (tools offered unless `tool_choice` is "none").
        `field`: the request field of the messages and the error code of a template
        that cannot render them (the client's 400)."""
        hashes, link = await self._link(session.id, messages, tools)
        mode = session.prompt_mode or self.prompt_mode
        rendered = self.render(messages, tools, tool_choice, field, link, mode)
        prompt = Prompt(
            rendered.ids, field[0], rendered.text, rendered, conversation=hashes,
            prompt_mode=rendered.prompt_mode if mode != "template" else None,
            fallback=rendered.fallback,
        )  # fmt: skip
        if link is not None:
            prompt.parent = parent = link.parent
            if rendered.continues:  # built on the parent's ids
                prompt.continues = True
            else:  # does it start with exactly the tokens the parent saw and produced?
                shared = continued_length(parent.prompt_ids, parent.output_ids, rendered.ids)
                prompt.continues = shared == len(parent.prompt_ids) + len(parent.output_ids)
                if not prompt.continues:
                    prompt.drift = self._drift(parent, rendered.ids, shared)
        return prompt

    def render(
        self,
        messages: Messages,
        tools: Tools,
        tool_choice: Any,
        field: tuple[str, str],
        link: Link | None = None,
        prompt_mode: str = "template",
    ) -> Rendered:
        """The prompt (tools offered unless `tool_choice` is "none"): with
        `prompt_mode="token_exact"`, the parent's ids + the new messages (when that can be
        told, else a counted fallback); otherwise the template's, on the parent's tokens
        where it provably continues them. A template that cannot render the request is the
        client's 400 (on `field`: param, code)."""
        tools = None if tool_choice == "none" else tools
        try:
            if prompt_mode == "token_exact" and link is not None:
                rendered = self._token_exact(messages, tools, tool_choice, link)
                if rendered.fallback is None:
                    return rendered
                template = self._template(messages, tools, tool_choice, link)
                return replace(template, fallback=rendered.fallback)
            return self._template(messages, tools, tool_choice, link)
        except Exception as exc:  # jinja errors, bad message shapes
            param, code = field
            raise APIError(
                400,
                f"could not apply the chat template: {exc}",
                code=code,
                param=param,
            ) from exc

    def remember(self, turn: Turn, out: ChoiceOutput, answer_hash: str) -> None:
        """Keep a recorded answer for its child: its tokens, its text prefix and its hash
        state."""
        prefix = None
        prompt = turn.prompt
        if prompt.rendered is not None and prompt.prompt_mode != "token_exact":
            # (a token_exact prompt's text is only its new messages': no prefix to give)
            prefix = self.renderer.text_prefix(prompt.rendered, out.output_ids)
        resume = prompt.conversation.resume_point(answer_hash) if prompt.conversation else None
        output_ids = self.renderer.interned(out.output_ids)  # (see ChatRenderer.interned)
        parent = Parent(
            out.completion_id, turn.prompt_ids, output_ids, turn.request, prefix, resume
        )
        self.recent.put((turn.session_id, answer_hash), parent)
        if resume is not None:
            key = (turn.session_id, len(resume.messages))
            answered = self._answered.get(key) or ()
            # one entry per choice of a request; a few more for re-sent turns
            self._answered.put(key, (*answered[-2 * self.max_n :], answer_hash))

    def forget(self, session_id: str) -> None:
        """An ended session takes no more turns: its answers need not be kept."""
        self.recent.drop_group(session_id)
        self._answered.drop_group(session_id)

    # ---- link ------------------------------------------------------------------------
    async def _link(
        self, session_id: str, messages: Messages, tools: Tools
    ) -> tuple[ConversationHash, Link | None]:
        """The request's conversation hash and the parent it continues.

        The hash resumes from a parent this process answered when the request repeats
        that parent's messages and answer (its last assistant message): a long session
        hashes only its new messages each turn."""
        k = last_answer(messages)
        answered = self._answered.get((session_id, k)) if k is not None else None
        if answered:
            answer = framed(messages[k])
            for h in reversed(answered):
                parent = self.recent.get((session_id, h))
                resume = parent.conversation if parent is not None else None
                if resume is not None and resume.continued_by(messages, tools, answer):
                    return ConversationHash(messages, tools, resume), Link(parent, 0)
        hashes = ConversationHash(messages, tools)
        return hashes, await self._find_parent(session_id, hashes.candidates)

    async def _find_parent(self, session_id: str, hashes: list[str]) -> Link | None:
        """The latest recorded answer whose (request + answer) hash is in `hashes`
        (longest prefix first).

        A cached hit on the longest prefix is the answer. A hit further down is only an
        ancestor this process served: a longer prefix may have been answered by another
        replica of a shared store, so the store is asked about those first.
        """
        for rank, h in enumerate(hashes):
            hit = self.recent.get((session_id, h))
            if hit is not None:
                if rank == 0:
                    return Link(hit, 0)
                return await self._stored_parent(session_id, hashes[:rank]) or Link(hit, rank)
        return await self._stored_parent(session_id, hashes)

    async def _stored_parent(self, session_id: str, hashes: list[str]) -> Link | None:
        """The store's answer, asked off the event loop: a shared PostgreSQL is a network
        round trip away, and every other request would wait for it."""
        if not hashes:
            return None
        found = await asyncio.to_thread(self.repo.find_parent, session_id, hashes)
        if found is None:
            return None
        cid, full, rank = found
        return Link(Parent(cid, full.prompt_ids, full.output_ids, full.request), rank)

    # ---- render ----------------------------------------------------------------------
    def _token_exact(
        self, messages: Messages, tools: Tools, tool_choice: Any, link: Link
    ) -> Rendered:
        start = answer_positions(messages)[link.rank] + 1
        prompt_ids, output_ids = link.parent.prompt_ids, link.parent.output_ids
        rendered = self.renderer.render_token_exact(
            messages, start, (prompt_ids, output_ids), tools, tool_choice
        )
        kind = "fallbacks" if rendered.fallback else "built"
        self.metrics.inc(f"turnstile_prompts_token_exact_{kind}_total")
        return rendered

    def _template(
        self, messages: Messages, tools: Tools, tool_choice: Any, link: Link | None
    ) -> Rendered:
        parent = link.parent if link is not None else None
        on = (
            (parent.prompt_ids, parent.output_ids, parent.prefix)
            if parent is not None and parent.prefix is not None
            else None
        )
        rendered = self.renderer.render(messages, tools, tool_choice, on)
        if on is not None:
            kind = "incremental" if rendered.incremental else "fallbacks"
            self.metrics.inc(f"turnstile_prompts_{kind}_total")
        return rendered

    def _drift(self, parent: Parent, prompt_ids: list[int], at: int) -> dict[str, Any]:
        """Why this prompt leaves its parent's tokens at `at`; counted in /metrics."""
        decode = self.renderer.decode
        calls = make_tool_parser(self.tool_parser)
        calls.feed(decode(parent.output_ids))
        calls.finish()
        found = drift(
            parent.prompt_ids, parent.output_ids, prompt_ids, at, decode, bool(calls.tool_calls)
        )
        self.metrics.inc("turnstile_prompt_drift_total")
        self.metrics.inc(f"turnstile_prompt_drift_{found['cause'] or 'unknown'}_total")
        return found
