"""A real headless Chromium (Debian's `chromium`, set up by `make browser-setup`), driven
by Playwright for Python through `executable_path`: Playwright never downloads a browser.

Screenshots go to the test's tmp folder; with TURNSTILE_UPDATE_SCREENSHOTS=1 they are
also written to docs/images/, where the README and docs/viewer.md show them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOC_IMAGES = REPO / "docs" / "images"


def chromium_path() -> str:
    path = os.environ.get("TURNSTILE_CHROMIUM") or shutil.which("chromium")
    if not path:
        raise RuntimeError(
            "no chromium on PATH: run `make browser-setup` (apt-get install chromium), "
            "or set TURNSTILE_CHROMIUM to a Chromium binary"
        )
    return path


@contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: tests run as root in containers, where Chromium's sandbox cannot start
        browser = p.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, tmp_path: Path, name: str, **kwargs: Any) -> Path:
    out = tmp_path / f"{name}.png"
    page.screenshot(path=str(out), **kwargs)
    assert out.stat().st_size > 10_000, "a screenshot of a rendered page is not near-empty"
    if os.environ.get("TURNSTILE_UPDATE_SCREENSHOTS") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, DOC_IMAGES / out.name)
    return out
