"""How a session's prompts are built is the option `prompt_mode` (`template` |
`token_exact`); `history` names a conversation's messages only. What users wrote under
the option's former name, `history`, still works: a session body's key, a trainer YAML's
`gateway.history`, `turnstile serve --history`, and records written before the rename."""

from __future__ import annotations

import warnings

import pytest
import sqlalchemy as sa
from gateway_helpers import (
    admin_headers,
    assert_error_shape,
    bearer,
    read_session,
    store_connection,
)

from trainer.api.config import ConfigError, load_config
from trainer.cli import build_parser

pytestmark = pytest.mark.both_stores

MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def _create(gateway, http, body):
    return http.post(f"{gateway.url}/sessions", headers=admin_headers(), json=body)


# ---- the session body ---------------------------------------------------------------------
@pytest.mark.parametrize("key", ["prompt_mode", "history"])
def test_a_session_chooses_its_prompt_mode_under_either_name(fake_gateway, http, key) -> None:
    r = _create(fake_gateway, http, {key: "token_exact"})
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["prompt_mode"] == "token_exact" and "history" not in created
    session_id = created["id"]
    answer = http.post(
        f"{fake_gateway.url}/chat/completions",
        headers=bearer(created["api_key"]),
        json={"model": "default", "messages": MESSAGES},
    )
    assert answer.status_code == 200, answer.text
    read = read_session(fake_gateway, session_id)
    assert read["prompt_mode"] == "token_exact"
    # a token_exact session's record says what built its prompt (a first turn: the template)
    assert [c["diagnostics"]["prompt_mode"] for c in read["completions"]] == ["template"]
    page = http.get(
        f"{fake_gateway.url.removesuffix('/v1')}/ui/sessions/{session_id}", headers=admin_headers()
    )
    assert "prompt_mode=token_exact" in page.text  # the viewer's session page
    with store_connection(fake_gateway.config.database) as con:  # the column kept its name
        q = sa.text("SELECT history FROM sessions WHERE id = :id")
        assert con.execute(q, {"id": session_id}).scalar_one() == "token_exact"


@pytest.mark.parametrize(
    "body",
    [
        {"prompt_mode": "exact"},
        {"history": "exact"},
        {"prompt_mode": "token_exact", "history": "template"},  # which one? the client's error
    ],
    ids=["unknown-value", "unknown-value-old-name", "both-names"],
)
def test_a_bad_prompt_mode_is_a_400_in_the_apis_shape(fake_gateway, http, body) -> None:
    err = assert_error_shape(_create(fake_gateway, http, body), 400)
    assert err["param"] and any(k in err["param"] for k in body), err


def test_the_openapi_document_names_prompt_mode_only(fake_gateway, http) -> None:
    root = fake_gateway.url.removesuffix("/v1")
    schemas = http.get(f"{root}/openapi.json").json()["components"]["schemas"]
    for name in ("CreateSessionRequest", "SessionView"):
        assert "prompt_mode" in schemas[name]["properties"]
        assert "history" not in schemas[name]["properties"]


def test_records_written_under_the_old_names_read_under_the_new(
    fake_gateway, new_session, http
) -> None:
    session_id, key = new_session(fake_gateway, prompt_mode="token_exact")
    body = {"model": "default", "messages": MESSAGES}
    r = http.post(f"{fake_gateway.url}/chat/completions", headers=bearer(key), json=body)
    assert r.status_code == 200, r.text
    old = {"history": "template", "history_fallback": "no_answer", "tool_parse_failures": 1}
    with store_connection(fake_gateway.config.database) as con:
        update = sa.text("UPDATE completions SET diagnostics = :d WHERE session_id = :s")
        con.execute(
            update.bindparams(sa.bindparam("d", type_=sa.JSON)), {"d": old, "s": session_id}
        )
        con.commit()
    [record] = read_session(fake_gateway, session_id)["completions"]
    assert record["diagnostics"] == {
        "prompt_mode": "template",
        "prompt_mode_fallback": "no_answer",
        "tool_parse_failures": 1,
    }


# ---- the trainer's YAML and the CLI (no store) ---------------------------------------------
@pytest.mark.parametrize("key", ["prompt_mode", "history"])
def test_a_config_sets_prompt_mode_under_either_name(tmp_path, key) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"gateway:\n  {key}: token_exact\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_config(path).gateway.prompt_mode == "token_exact"
    said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    if key == "history":  # the warning names the new key
        assert said == ["gateway.history is now gateway.prompt_mode; the old name is still read"]
    else:
        assert said == []


def test_a_config_setting_both_names_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"gateway.history is the old name of gateway.prompt"):
        load_config(None, ["gateway.prompt_mode=template", "gateway.history=token_exact"])


@pytest.mark.parametrize("flag", ["--prompt-mode", "--history"])
def test_serve_takes_the_flag_under_either_name(flag) -> None:
    args = build_parser().parse_args(["serve", flag, "token_exact"])
    assert args.prompt_mode == "token_exact"
    assert build_parser().parse_args(["serve"]).prompt_mode == "template"


def test_serve_refuses_an_unknown_prompt_mode(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", "--history", "exact"])
    assert exit_.value.code == 2
    assert "invalid choice: 'exact'" in capsys.readouterr().err
