"""A process that starts and stops gateways in it (the trainer, a user's test harness)
gets back what each one held. A gateway freezes the objects it starts with out of the
garbage collector's way (gateway/app.py); a stopped one must let them go, or every
embedded engine's model stays in memory (the suite's own process grew ~600 MB a test
module that starts one, until the OOM killer stopped it)."""

from __future__ import annotations

import gc
import weakref

from gateway_helpers import ADMIN_KEY, FAKE_REPLY, bearer, http_client

from gateway.config import GatewayConfig
from gateway.inference.fake import FakeEngine
from gateway.server import BackgroundGateway


def test_a_stopped_gateways_engine_is_freed(new_database, tokenizer):
    engine = FakeEngine(tokenizer.encode(FAKE_REPLY), stop_id=int(tokenizer.eos_token_id))
    engine.cycle = engine  # (a model's modules, hooks and threads make such cycles)
    freed = weakref.ref(engine)
    config = GatewayConfig(port=0, database=new_database(), admin_key=ADMIN_KEY, engine="fake")
    gw = BackgroundGateway(config, engine=engine).start()
    with http_client() as http:
        r = http.post(f"{gw.url}/sessions", json={}, headers=bearer(ADMIN_KEY))
        assert r.status_code == 201, r.text
    gw.stop()
    del gw, engine
    gc.collect()
    assert freed() is None, "the stopped gateway's engine is still in memory"
