"""`/ui`: the session viewer and run dashboard, server-rendered by the gateway itself.

Pages are Jinja templates; the only script is a token tooltip and the run page's
charts (uPlot, vendored in static/vendor at a pinned version: no frontend build).
"""

from __future__ import annotations

import math
import mimetypes
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field

from gateway.auth import bearer_token
from gateway.errors import APIError
from gateway.samples import EXPORT_STYLES
from gateway.state import GatewayState, State
from gateway.store.summaries import SessionFilter
from gateway.ui.openapi import key_parameters, metrics_responses, page_responses, static_responses
from gateway.ui.runs import run_dir, run_metrics
from gateway.ui.session_view import build_session_view
from gateway.ui.tokens import TokenTexts

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
# the files /ui/static serves: a fixed set, so no path from a request reaches the disk
STATIC_FILES = {p.relative_to(STATIC).as_posix(): p for p in STATIC.rglob("*") if p.is_file()}
PAGE_SIZE = 50
COOKIE = "turnstile_admin"  # where a browser keeps the admin key (see `_gate`)

router = APIRouter(prefix="/ui", tags=["viewer"])
templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["fmt"] = lambda v, d=3: "" if v is None else f"{v:.{d}f}"


def _texts(state: GatewayState) -> TokenTexts:
    cached = state.handlers.get(TokenTexts)
    if cached is None:
        cached = state.handlers[TokenTexts] = TokenTexts(state.renderer.tokenizer)
    return cached


def _page(request: Request, name: str, code: int = 200, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=code)


def _error(request: Request, status: int, message: str) -> HTMLResponse:
    return _page(request, "error.html", status, message=message, status=status)


def _offered_key(request: Request) -> str | None:
    return bearer_token(request) or request.cookies.get(COOKIE) or request.query_params.get("key")


def _gate(request: Request, state: GatewayState) -> Response | None:
    """None when the caller is the admin (or no admin key is set: the gateway is then
    loopback-only and the viewer open, as the API is); else the key form, the lockout
    page, or the redirect that moves a `?key=` out of the address bar.

    A browser cannot send an `Authorization` header on a link, so the key may come once
    as `?key=`: it is checked, kept in an HttpOnly cookie scoped to /ui, and the page
    reloads without it (so it leaves the address bar and history). A key offered here
    that is not the admin key counts against its client as a failed key check, and a
    locked-out client gets a 429 (auth_limits.py): the form is a way to guess the admin
    key like any other. A cookie that is not the admin key (it was changed) is cleared,
    rather than offered and counted on every page the browser loads."""
    try:
        admin = state.keys.check_admin(request, _offered_key(request))
    except APIError as exc:  # this client is locked out (auth_limits.py)
        page = _error(request, exc.status, exc.message)
        page.headers.update(exc.headers)
        return page
    if not admin:
        page = _page(request, "login.html", 401, bad_key=_offered_key(request) is not None)
        cookie = request.cookies.get(COOKIE)
        if cookie is not None and not state.keys.is_admin_key(cookie):
            page.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return page
    key = request.query_params.get("key")
    if key is None:
        return None
    rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "key"])
    target = request.url.path + (f"?{rest}" if rest else "")
    response = RedirectResponse(target, status_code=303)
    if state.keys.is_admin_key(key):  # not a wrong one beside an admin header
        response.set_cookie(COOKIE, key, httponly=True, samesite="strict", path="/ui")
    return response


def _html_page(*not_found: int) -> dict[str, Any]:
    """A page's route arguments: what it declares in /openapi.json (fresh each time)."""
    return {
        "response_class": HTMLResponse,
        "responses": page_responses(*not_found),
        "openapi_extra": key_parameters(COOKIE),
    }


def _yes_no(value: str | None, yes: str = "yes", no: str = "no") -> bool | None:
    return True if value == yes else False if value == no else None


class SessionsQuery(BaseModel):
    """The session list's filters and page, as `/ui/sessions?...` gives them (FastAPI
    reads a query-parameter model field by field; other parameters, `key`, pass by)."""

    status: str | None = None  # active, ended or expired
    reward: str | None = None  # present or missing
    drift: str | None = None  # yes or no
    errors: str | None = None  # yes or no: a tool call that did not parse, an aborted answer
    run: str | None = None  # metadata run=
    step: str | None = None  # metadata step=
    agent: str | None = None  # metadata agent=
    meta: list[str] | None = None  # key=value metadata filters
    page: int = Field(1, ge=1, le=1_000_000)

    def filters(self) -> SessionFilter:
        """The store's filter; a ValueError says what the error page should."""
        if self.status not in (None, "", "active", "ended", "expired"):
            raise ValueError(f"status must be active, ended or expired, not {self.status!r}.")
        named = (("run", self.run), ("step", self.step), ("agent", self.agent))
        metadata = {k: v for k, v in named if v}
        for item in self.meta or []:
            if "=" not in item:
                raise ValueError(f"meta filters look like key=value, not {item!r}.")
            k, v = item.split("=", 1)
            metadata[k.strip()] = v.strip()
        return SessionFilter(
            status=self.status or None,  # type: ignore[arg-type]
            has_reward=_yes_no(self.reward, "present", "missing"),
            drifted=_yes_no(self.drift),
            errors=_yes_no(self.errors),
            metadata=metadata,
        )


@router.get("", **_html_page())
@router.get("/sessions", **_html_page())
async def sessions_page(
    request: Request, state: State, query: Annotated[SessionsQuery, Query()]
) -> Response:
    if (gate := _gate(request, state)) is not None:
        return gate
    try:
        filters = query.filters()
    except ValueError as exc:
        return _error(request, 400, str(exc))
    page = query.page
    rows = await run_in_threadpool(
        state.repo.session_summaries, filters, PAGE_SIZE + 1, (page - 1) * PAGE_SIZE
    )
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "page"]
    return _page(
        request,
        "sessions.html",
        sessions=rows[:PAGE_SIZE],
        page=page,
        has_next=len(rows) > PAGE_SIZE,
        params=dict(request.query_params),
        meta=query.meta or [],
        page_url=lambda n: "/ui/sessions?" + urlencode([*rest, ("page", n)]),
    )


@router.get("/sessions/{session_id}", **_html_page(404))
async def session_page(
    session_id: str,
    request: Request,
    state: State,
    style: str = "individual",
    turn_discount: str = "1.0",
) -> Response:
    if (gate := _gate(request, state)) is not None:
        return gate
    if style not in EXPORT_STYLES:
        return _error(
            request, 400, f"Unknown export style {style!r}; known: {sorted(EXPORT_STYLES)}."
        )
    try:
        gamma = float(turn_discount)
    except ValueError:
        gamma = math.nan
    if not 0.0 <= gamma <= 1.0:
        return _error(
            request, 400, f"turn_discount must be a number in [0, 1], not {turn_discount!r}."
        )
    info = await run_in_threadpool(state.repo.session, session_id)
    if info is None:
        return _error(request, 404, f"No session {session_id!r}.")
    completions = await run_in_threadpool(state.repo.completions, session_id)
    view = await run_in_threadpool(
        build_session_view, session_id, completions, _texts(state), style, gamma
    )
    return _page(
        request,
        "session.html",
        info=info,
        view=view,
        styles=sorted(EXPORT_STYLES),
        status="ended" if info.ended else ("expired" if info.expired() else "active"),
    )


@router.get("/runs", **_html_page())
async def runs_page(request: Request, state: State) -> Response:
    if (gate := _gate(request, state)) is not None:
        return gate
    runs = [Path(p) for p in state.config.run_dirs]
    return _page(request, "runs.html", runs=runs)


@router.get("/runs/{index}", **_html_page(404))
async def run_page(index: int, request: Request, state: State) -> Response:
    if (gate := _gate(request, state)) is not None:
        return gate
    run = run_dir(state.config.run_dirs, index)
    if run is None:
        return _error(
            request, 404, f"No run {index}; the gateway knows {len(state.config.run_dirs)}."
        )
    return _page(request, "run.html", run=run, index=index)


@router.get(
    "/runs/{index}/metrics.json",
    responses=metrics_responses(),
    openapi_extra=key_parameters(COOKIE),
)
async def run_metrics_json(index: int, request: Request, state: State) -> Response:
    """Its errors (raised: the 429 from `check_admin` too) in OpenAI's shape, as every JSON
    error of the gateway."""
    if not state.keys.check_admin(request, _offered_key(request)):
        raise APIError(401, "This needs the admin key.", code="admin_key_required")
    run = run_dir(state.config.run_dirs, index)
    if run is None:
        raise APIError(404, f"No run {index}.", code="run_not_found")
    return JSONResponse(await run_in_threadpool(run_metrics, run))


@router.get(
    "/static/{name:path}", response_class=Response, responses=static_responses(STATIC_FILES)
)
async def static(name: str) -> Response:
    """Open to all: vendored library and stylesheet, nothing recorded."""
    path = STATIC_FILES.get(name)
    if path is None:
        return PlainTextResponse("not found", status_code=404)
    media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media, headers={"Cache-Control": "max-age=3600"})
