"""The model's tokenizer read from its files on the `tokenizers` library, without transformers.

Behind an external engine the gateway needs a tokenizer, never a model; importing
transformers (and torch) held ~460 MB where a pass-through holds ~60. `ModelTokenizer`
reads the files transformers reads and offers the part of its API the gateway uses,
with the same results (tests/test_model_tokenizer.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from gateway.malloc import release_free_memory

# transformers' named special tokens, in its order (SPECIAL_TOKENS_ATTRIBUTES)
SPECIAL_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"
)  # fmt: skip
# what a checkpoint folder needs to load the same tokenizer again
FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
CHAT_TEMPLATE_DIR = "additional_chat_templates"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level table (each byte's character in a byte-level BPE vocabulary):
    transformers' `bytes_to_unicode`, without importing transformers (tests compare)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    others = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}
    return dict(sorted(table.items()))


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: text, an AddedToken object, or null."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _chat_template(folder: Path, config: dict[str, Any]) -> str | dict[str, str] | None:
    """transformers' choice: `chat_template.jinja` (and `additional_chat_templates/`) over
    the config's `chat_template` (text, or a list of named templates)."""
    templates: dict[str, str] = {}
    if (folder / "chat_template.jinja").is_file():
        templates["default"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    for path in sorted((folder / CHAT_TEMPLATE_DIR).glob("*.jinja")):
        templates[path.stem] = path.read_text(encoding="utf-8")
    if list(templates) == ["default"]:
        return templates["default"]
    if templates:
        return templates
    template = config.get("chat_template")
    if isinstance(template, list):
        return {t["name"]: t["template"] for t in template}
    return template


def _json_file(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _special_id(name: str) -> Any:
    """A property: the id of the named special token (None when there is none)."""
    return property(lambda self: self._id_of(name))


class ModelTokenizer:
    """A model folder's tokenizer: the Rust `tokenizers.Tokenizer` of its tokenizer.json
    and what tokenizer_config.json says around it, with transformers' method names."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.name_or_path = str(folder)
        self.backend_tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        # special_tokens_map.json merged into the config, as transformers does
        config = {
            **_json_file(self.folder / "special_tokens_map.json"),
            **_json_file(self.folder / "tokenizer_config.json"),
        }
        self.special_tokens_map: dict[str, str] = {
            name: text for name in SPECIAL_NAMES if (text := _content(config.get(name))) is not None
        }
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens")
        extra_tokens = [_content(t) for t in extra] if isinstance(extra, list) else []
        self.all_special_tokens: list[str] = list(
            dict.fromkeys([*self.special_tokens_map.values(), *filter(None, extra_tokens)])
        )
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self.chat_template = _chat_template(self.folder, config)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def _id_of(self, name: str) -> int | None:
        token = self.special_tokens_map.get(name)
        return None if token is None else self.convert_tokens_to_ids(token)

    bos_token_id = _special_id("bos_token")
    eos_token_id = _special_id("eos_token")
    unk_token_id = _special_id("unk_token")
    pad_token_id = _special_id("pad_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def all_special_ids(self) -> list[int]:
        return [self.convert_tokens_to_ids(t) for t in self.all_special_tokens]

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return self.backend_tokenizer.get_added_tokens_decoder()

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """The token's id; the unknown token's id (or None) when it has none."""
        index = self.backend_tokenizer.token_to_id(token)
        if index is None:
            unk = self.special_tokens_map.get("unk_token")
            return None if unk is None else self.backend_tokenizer.token_to_id(unk)
        return index

    def convert_ids_to_tokens(self, index: int) -> str | None:
        return self.backend_tokenizer.id_to_token(int(index))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        # transformers cleans up spaces only for tokenizers other than BPE
        bpe = type(self.backend_tokenizer.model).__name__ == "BPE"
        if self.clean_up_tokenization_spaces and not bpe:
            text = _clean_up_tokenization(text)
        return text

    def batch_decode(self, batch: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    def save_pretrained(self, path: str | Path) -> None:
        """Copy the files it was read from: the folder loads as the same tokenizer."""
        target = Path(path)
        target.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            if (self.folder / name).is_file():
                shutil.copyfile(self.folder / name, target / name)
        if (self.folder / CHAT_TEMPLATE_DIR).is_dir():
            shutil.copytree(self.folder / CHAT_TEMPLATE_DIR, target / CHAT_TEMPLATE_DIR,
                            dirs_exist_ok=True)  # fmt: skip


def _clean_up_tokenization(text: str) -> str:
    """transformers' `clean_up_tokenization` (spaces before punctuation, WordPiece's)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                          (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                          (" 're", "'re")):  # fmt: skip
        text = text.replace(before, after)
    return text


def load_tokenizer(model_dir: str | Path) -> ModelTokenizer:
    """The tokenizer the gateway serves with, read from a model folder without
    transformers (`model_source.load_tokenizer` gives transformers' own)."""
    if not (Path(model_dir) / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"{model_dir} has no tokenizer.json: the gateway reads a fast tokenizer's files"
        )
    tokenizer = ModelTokenizer(model_dir)
    release_free_memory()  # tokenizer.json's text and parse tree (~14 MB), a tenth of the RSS
    return tokenizer
