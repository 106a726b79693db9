"""The gateway's own tokenizer (gateway/chat/tokenizer.py) against transformers' AutoTokenizer.

Behind an external engine the gateway reads the model's tokenizer files itself on the
`tokenizers` library, so it never imports transformers or torch (issue 32, item 6).
These tests hold it to `AutoTokenizer` for every family we test and the bundled model:
ids of random text (with and without special tokens added), text of random ids, the
special tokens and their ids, added tokens, vocabulary and chat template. Then a real
`turnstile serve` in front of an external engine answers a chat request with neither
torch nor transformers loaded, in at most 150 MB.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from fake_sglang_server import FakeSGLangServer
from family_helpers import FAMILIES, family_tokenizer
from fetch_tokenizers import family_dir

from gateway.chat.tokenizer import bytes_to_unicode, load_tokenizer
from gateway.inference.model_source import resolve_model_dir
from gateway.server import free_port

NAMES = [*FAMILIES, "smollm2"]
PIECES = [
    "Hello", " world", "!", "  ", "\n", "\n\n", "\t", "don't", " 's", " ,", " .", "?", "42",
    "1234567", "é", "ü", "日本語", "🙂", "Привет", "ｶﾀｶﾅ", "\u00a0", "<tool_call>", "{\"a\": 1}",
    "<b>", "</s>", "<s>", "[INST]", "<|im_start|>", "<|im_end|>", "<|eot_id|>", "<think>",
]  # fmt: skip
RSS_LIMIT_MB = 150


def _pair(name: str) -> tuple[Any, Any]:
    """(transformers' tokenizer, ours) of one folder."""
    from transformers import AutoTokenizer

    if name == "smollm2":
        folder = resolve_model_dir(None)
        return AutoTokenizer.from_pretrained(folder), load_tokenizer(folder)
    family_tokenizer(name)  # fails clearly when the family's files are not fetched
    return AutoTokenizer.from_pretrained(family_dir(name)), load_tokenizer(family_dir(name))


def _texts(rng: random.Random, specials: list[str], n: int) -> list[str]:
    pieces = PIECES + specials[:20]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(n)]


@pytest.mark.parametrize("name", NAMES)
def test_what_the_gateway_reads_equals_autotokenizer(name: str) -> None:
    theirs, ours = _pair(name)
    for attr in ("special_tokens_map", "all_special_tokens", "all_special_ids", "bos_token_id",
                 "eos_token_id", "unk_token_id", "pad_token_id", "eos_token", "chat_template",
                 "clean_up_tokenization_spaces"):  # fmt: skip
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert len(ours) == len(theirs)
    assert ours.get_vocab() == theirs.get_vocab()
    added = {i: (t.content, t.special) for i, t in theirs.added_tokens_decoder.items()}
    assert {i: (t.content, t.special) for i, t in ours.added_tokens_decoder.items()} == added
    for token in ["<|im_end|>", "</s>", "no-such-token-here", *list(theirs.get_vocab())[:50]]:
        assert ours.convert_tokens_to_ids(token) == theirs.convert_tokens_to_ids(token)
    for i in (0, 1, len(theirs) - 1, *added):
        assert ours.convert_ids_to_tokens(i) == theirs.convert_ids_to_tokens(i)


@pytest.mark.parametrize("name", NAMES)
def test_ids_and_texts_equal_autotokenizers(name: str) -> None:
    theirs, ours = _pair(name)
    rng = random.Random(f"tok-{name}")
    specials = [t.content for t in theirs.added_tokens_decoder.values()]
    for text in _texts(rng, specials, 300):
        for add in (False, True):
            assert ours.encode(text, add_special_tokens=add) == theirs.encode(
                text, add_special_tokens=add
            ), (text, add)
    added = list(theirs.added_tokens_decoder)
    batch = [
        [rng.randrange(len(theirs)) if rng.random() < 0.9 else rng.choice(added)
         for _ in range(rng.randint(1, 24))]
        for _ in range(300)
    ]  # fmt: skip
    for skip in (False, True):
        assert ours.batch_decode(batch, skip_special_tokens=skip) == theirs.batch_decode(
            batch, skip_special_tokens=skip
        )
    for text in _texts(rng, specials, 50):  # text -> ids -> text
        ids = theirs.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == theirs.decode(ids)


def test_the_byte_table_is_transformers() -> None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode as theirs

    assert bytes_to_unicode() == theirs()


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_a_saved_copy_loads_as_the_same_tokenizer(name: str, tmp_path: Path) -> None:
    """What the trainer writes beside a checkpoint (`save_pretrained`) loads in transformers
    as the tokenizer it was read from."""
    from transformers import AutoTokenizer

    theirs, ours = _pair(name)
    ours.save_pretrained(tmp_path / "copy")
    again = AutoTokenizer.from_pretrained(tmp_path / "copy")
    text = "Hi <|im_end|> there, 日本語 🙂"
    assert again.encode(text) == theirs.encode(text)
    assert again.chat_template == theirs.chat_template
    assert again.special_tokens_map == theirs.special_tokens_map


def test_a_folder_without_tokenizer_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


_LOADED = """
import sys, gateway.app
from gateway.config import GatewayConfig
app = gateway.app.create_app(GatewayConfig(engine="sglang", engine_urls=["http://127.0.0.1:9"],
                                           database=sys.argv[1]))
print(sorted(m for m in ("torch", "transformers", "openai") if m in sys.modules))
print(sorted(app.openapi()["components"]["schemas"].keys() & {"ChatCompletion", "Response"}))
"""


def test_the_gateway_behind_an_external_engine_imports_no_torch(tmp_path: Path) -> None:
    """Building the whole app for an external engine loads neither torch nor transformers,
    nor the OpenAI SDK (~24 MB) whose reply types /openapi.json still documents."""
    out = subprocess.run(
        [sys.executable, "-c", _LOADED, str(tmp_path / "g.db")],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    loaded, documented = out.stdout.strip().splitlines()[-2:]
    assert loaded == "[]", out.stdout + out.stderr
    assert documented == "['ChatCompletion', 'Response']"


@pytest.mark.slow
def test_turnstile_serve_behind_an_external_engine_is_small(tmp_path: Path) -> None:
    """`turnstile serve --engine sglang` answers a chat request with no torch or model code
    mapped into the process, in at most RSS_LIMIT_MB of RSS."""
    tok = load_tokenizer(resolve_model_dir(None))
    port = free_port()
    argv = [str(Path(sys.executable).parent / "turnstile"), "serve", "--engine", "sglang",
            "--port", str(port), "--database", str(tmp_path / "g.db"), "--admin-key", "adm-k"]  # fmt: skip
    with FakeSGLangServer(eos_id=int(tok.eos_token_id), stop_after=8) as engine:
        proc = subprocess.Popen(
            [*argv, "--engine-url", engine.url], stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "serve.log", "w"),  # noqa: SIM115 (the child holds it)
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            _wait(url + "/healthz", proc, tmp_path / "serve.log")
            with httpx.Client(timeout=60) as http:
                made = http.post(f"{url}/v1/sessions", headers={"Authorization": "Bearer adm-k"},
                                 json={})  # fmt: skip
                made.raise_for_status()
                key = {"Authorization": f"Bearer {made.json()['api_key']}"}
                for turn in range(3):
                    reply = http.post(f"{url}/v1/chat/completions", headers=key, json={
                        "model": "default", "max_tokens": 8,
                        "messages": [{"role": "user", "content": f"Hello {turn}"}],
                    })  # fmt: skip
                    assert reply.status_code == 200, reply.text
            process = psutil.Process(proc.pid)
            mapped = {m.path for m in process.memory_maps()}
            assert not [p for p in mapped if "torch" in p or "transformers" in p]
            rss_mb = process.memory_info().rss / 2**20
            assert rss_mb <= RSS_LIMIT_MB, f"RSS {rss_mb:.1f} MB"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"turnstile serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"turnstile serve did not start: {log.read_text()[-2000:]}")
