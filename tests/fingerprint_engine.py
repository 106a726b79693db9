"""A DeepSpeedEngine (through `train.engine_class`, as a user would) that writes, when
the run saves its final weights, a digest of the weights this rank holds, to
`<folder>/../weights-rank<N>.sha256`: ranks on different nodes can then be shown to
hold the same model."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from trainer.backend.deepspeed_engine import DeepSpeedEngine


class FingerprintEngine(DeepSpeedEngine):
    def save_hf(self, path: Path, tokenizer: Any = None) -> Path:
        digest = hashlib.sha256()
        for name, tensor in sorted(self.full_state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        (path.parent / f"weights-rank{self.rank}.sha256").write_text(digest.hexdigest())
        return super().save_hf(path, tokenizer)
