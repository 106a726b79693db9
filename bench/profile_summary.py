"""Where the gateway's CPU goes: py-spy's raw stacks folded into a few named costs.

py-spy (`record --format raw`) writes one line per distinct stack, root first, frames
joined by ';', each `function (file:line)`, then the sample count. Each sample goes to
the first rule below whose context it is in, so a JSON dump inside the parent-link hash
counts as linking, and pydantic inside FastAPI's body parsing counts as request
validation. The order of RULES is the priority.

    python -m bench.profile_summary runs/bench/gateway.pyspy.txt
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True, slots=True)
class Frame:
    func: str
    file: str

    def __str__(self) -> str:
        return f"{self.func} ({self.file})"


def parse_frame(text: str) -> Frame:
    m = _FRAME.match(text.strip())
    if m is None:
        return Frame(text.strip(), "")
    return Frame(m["func"], m["file"])


def in_file(*parts: str) -> Callable[[list[Frame]], bool]:
    return lambda st: any(any(p in f.file for p in parts) for f in st)


def in_func(*names: str) -> Callable[[list[Frame]], bool]:
    return lambda st: any(any(n in f.func for n in names) for f in st)


def frame(file_part: str, *names: str) -> Callable[[list[Frame]], bool]:
    """A frame in a file containing `file_part` whose function contains one of `names`."""
    return lambda st: any(file_part in f.file and any(n in f.func for n in names) for f in st)


def either(*preds: Callable[[list[Frame]], bool]) -> Callable[[list[Frame]], bool]:
    return lambda st: any(p(st) for p in preds)


def both(*preds: Callable[[list[Frame]], bool]) -> Callable[[list[Frame]], bool]:
    return lambda st: all(p(st) for p in preds)


# (name, test on the whole stack), in priority order; samples that match none go to the
# library that owns their deepest frame (see owner()).
RULES: list[tuple[str, Callable[[list[Frame]], bool]]] = [
    (
        "store: batched INSERT + COMMIT (recorder thread: SQLAlchemy + sqlite3)",
        frame("gateway/store/recorder.py", "Recorder._run", "Recorder._commit"),
    ),
    (
        "store: session-key lookup (SQLite SELECT, key cache expired)",
        both(in_file("gateway/auth.py"), in_file("sqlalchemy/", "sqlite3")),
    ),
    ("store: other reads (parent lookup, ...)", in_file("sqlalchemy/", "sqlite3")),
    (
        "sync FastAPI dependencies run in the thread pool (session_caller, get_state)",
        either(
            in_file("anyio/to_thread.py", "starlette/concurrency.py"),
            in_func("run_in_threadpool", "run_sync_in_worker_thread", "WorkerThread"),
            frame("gateway/state.py", "session_caller", "get_state"),
        ),
    ),
    ("fake engine (answers instantly)", in_file("gateway/inference/fake.py")),
    ("detokenising the output (IncrementalDecoder)", in_file("gateway/chat/detokenize.py")),
    (  # before tokenising: apply_chat_template lives in transformers' tokenization_*.py
        "chat template rendering (jinja2, apply_chat_template, message normalising)",
        either(
            in_file("jinja2/", "chat_template_utils", "gateway/chat/tools.py"),
            in_func("apply_chat_template", "render_text", "normalize_message", "text_of"),
        ),
    ),
    (
        "tokenising the rendered prompt (tokenizer.encode of the whole history)",
        in_file("tokenizers/", "tokenization_"),
    ),
    (
        "parent-link hashing (gateway/chat/linking.py: json.dumps + sha256)",
        in_file("gateway/chat/linking.py"),
    ),
    (
        "building the response (openai types: model_construct + model_dump(mode=json))",
        either(
            in_file("/protocol.py", "openai/_models.py"),
            frame("gateway/entrypoints/", "response", "message_model", "usage"),
        ),
    ),
    (
        "request dict for the record (req.model_dump)",
        both(frame("gateway/entrypoints/", "prepare"), in_func("model_dump")),
    ),
    (
        "record hand-off on the loop (row dict, pack_ints, queue, future)",
        either(frame("gateway/serving/core.py", "record", "pack_"), in_file("gateway/store/")),
    ),
    (
        "engine call wrapper (asyncio.wait_for, generate() generator)",
        frame("gateway/serving/core.py", "_bounded", "_engine_chunks", "generate"),
    ),
    ("request body hash (blake2b)", in_func("request_hash")),
    ("auth (session key sha256 + cache)", in_file("gateway/auth.py")),
    ("metrics", in_file("gateway/metrics.py")),
    (
        "response JSON encoding (FastAPI serialize_response, jsonable_encoder, JSONResponse)",
        in_func("serialize_response", "jsonable_encoder", "JSONResponse"),
    ),
    (
        "request validation (pydantic ChatCompletionRequest via FastAPI)",
        either(
            frame("fastapi/", "request_body_to_args", "_validate", "validate"),
            both(in_file("fastapi/"), in_file("pydantic/")),
        ),
    ),
    (
        "request body read + JSON parse",
        either(
            frame("starlette/requests.py", "Request.body", "Request.stream", "Request.json"),
            in_file("json/decoder.py"),
        ),
    ),
    (
        "FastAPI telemetry middleware (opentelemetry check per request)",
        either(
            in_file("opentelemetry/", "trace/__init__.py"),
            in_func("NativeTelemetry"),
            lambda st: "fastapi/telemetry/" in st[-1].file,
        ),
    ),
    ("FastAPI route matching", frame("fastapi/routing.py", "_match", "matches", "_get_routes")),
    (
        "FastAPI dependency resolution (solve_dependencies, per-request cache keys)",
        in_file("fastapi/dependencies/"),
    ),
]
OTHER = "other"
IDLE = ("Condition.wait", "Event.wait", "Thread.join", "Queue.get", "SimpleQueue.get")
# Frames that are on every stack of the main thread (the server's run loop): never owners.
NOT_OWNERS = (
    "uvicorn/main.py",
    "uvicorn/server.py",
    "uvicorn/_compat.py",
    "gateway/server.py",
    "gateway/cli.py",
)
OWNERS = [  # the library of a sample's deepest frame, for samples no rule claims
    (("h11/", "uvicorn/"), "HTTP/1.1 parsing + writing (uvicorn on h11, socket reads/writes)"),
    (
        ("fastapi/", "starlette/", "anyio/", "gateway/errors.py"),
        "FastAPI/Starlette request plumbing + middleware (exception wrappers, deps, headers)",
    ),
    (("gateway/",), "other gateway code (handlers, serving core, ids)"),
    (("pydantic/", "openai/"), "pydantic (other)"),
]
EVENT_LOOP = "asyncio event loop (select, callbacks, tasks, thread wake-ups)"


def owner(stack: list[Frame]) -> str:
    for f in reversed(stack):
        if any(p in f.file for p in NOT_OWNERS):
            continue
        for parts, name in OWNERS:
            if any(p in f.file for p in parts):
                return name
    return EVENT_LOOP if any("asyncio/" in f.file for f in stack) else OTHER


def is_idle(stack: list[Frame]) -> bool:
    return stack[-1].func in IDLE


LOOP, OTHERS = "event loop", "other threads"


def thread_of(stack: list[Frame]) -> str:
    """The main thread runs the event loop; the rest are the recorder and the pool."""
    return OTHERS if stack[0].func.startswith("Thread._bootstrap") else LOOP


@dataclass
class Profile:
    samples: int  # every sample py-spy took, idle ones included
    idle: int  # samples of threads waiting (queue.get, Condition.wait): left out
    groups: dict[str, Counter[str]]  # thread group -> category -> samples
    self_time: Counter[str]  # leaf function -> samples (busy only)

    @property
    def busy(self) -> int:
        return self.samples - self.idle

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "idle": self.idle,
            "groups": {g: dict(c.most_common()) for g, c in self.groups.items()},
            "self_time": dict(self.self_time.most_common(30)),
        }

    def markdown(
        self, concurrency: int | None = None, cpu_ms: dict[str, float] | None = None, hz: int = 100
    ) -> list[str]:
        """A table of costs; with `cpu_ms` (CPU ms/req of each thread group, measured
        without the profiler), each cost also in ms per request."""
        busy = self.busy or 1
        under = f" under {concurrency} sessions" if concurrency else ""
        head = (
            f"Where the gateway's CPU goes: py-spy at {hz} Hz{under}, {self.busy} busy "
            f"samples of all threads ({self.idle} samples of threads waiting on a queue left "
            "out). py-spy charges time in C code (the tokenizer, sqlite3) and in garbage "
            "collection to the Python line that called it, so GC has no row of its own "
            "here (see the GC table)."
        )
        if cpu_ms:
            head += (
                " *≈ ms/req* spreads each thread group's CPU time, measured above without "
                "the profiler, over its rows by their share of the group's samples."
            )
        lines = [head, ""]
        lines += ["| thread | cost | share of busy samples | ≈ ms/req |", "|---|---|---:|---:|"]

        def row(group: str, name: str, count: int, total: int) -> str:
            ms = f"{cpu_ms[group] * count / total:.3f}" if cpu_ms else "–"
            return f"| {group} | {name} | {100 * count / busy:.1f}% | {ms} |"

        for group in (LOOP, OTHERS):
            cats = self.groups.get(group, Counter())
            total = sum(cats.values()) or 1
            small = sum(c for c in cats.values() if c / busy < 0.005)
            for name, count in cats.most_common():
                if count / busy >= 0.005:
                    lines.append(row(group, name, count, total))
            if small:
                lines.append(row(group, "(smaller items, each < 0.5%)", small, total))
        lines += ["", "Top functions by own time (leaf frames, busy samples):", ""]
        lines += ["| function | share |", "|---|---:|"]
        for name, count in self.self_time.most_common(12):
            lines.append(f"| `{name}` | {100 * count / busy:.1f}% |")
        lines.append("")
        return lines


def categorise(stack: list[Frame]) -> str:
    for name, test in RULES:
        if test(stack):
            return name
    return owner(stack)


def summarise(path: Path | str) -> Profile:
    groups: dict[str, Counter[str]] = {LOOP: Counter(), OTHERS: Counter()}
    leaves: Counter[str] = Counter()
    total = idle = 0
    for line in Path(path).read_text(errors="replace").splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        try:
            count = int(count_text)
        except ValueError:
            continue
        frames = [parse_frame(f) for f in stack_text.split(";") if f.strip()]
        if not frames:
            continue
        total += count
        if is_idle(frames):
            idle += count
            continue
        groups[thread_of(frames)][categorise(frames)] += count
        leaves[str(frames[-1])] += count
    return Profile(total, idle, groups, leaves)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m bench.profile_summary RAW_PYSPY_FILE")
    prof = summarise(args[0])
    print("\n".join(prof.markdown()))


if __name__ == "__main__":
    main()
