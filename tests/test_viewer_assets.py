"""The viewer's vendored chart library is the pinned npm release, byte for byte, and
the gateway serves it (and nothing outside its static folder)."""

from __future__ import annotations

import hashlib
import re

import httpx

from gateway.ui.routes import STATIC

PINNED = {
    "uPlot.iife.min.js": "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    "uPlot.min.css": "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
}


def test_vendored_uplot_is_the_pinned_release():
    for name, digest in PINNED.items():
        assert hashlib.sha256((STATIC / "vendor" / name).read_bytes()).hexdigest() == digest
    head = (STATIC / "vendor" / "uPlot.iife.min.js").read_text()[:200]
    assert re.search(r"uPlot", head)


def test_static_files_served_and_paths_confined(fake_gateway):
    base = fake_gateway.url.removesuffix("/v1")
    r = httpx.get(f"{base}/ui/static/vendor/uPlot.iife.min.js")
    assert r.status_code == 200 and "javascript" in r.headers["content-type"]
    assert hashlib.sha256(r.content).hexdigest() == PINNED["uPlot.iife.min.js"]
    for bad in ("../routes.py", "..%2Froutes.py", "vendor/../../routes.py", "nope.js"):
        assert httpx.get(f"{base}/ui/static/{bad}").status_code == 404
