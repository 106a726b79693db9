"""The user-facing contracts (#32 item 5): one `trainer.api` package, and a config whose
every field says what it does, in `turnstile train --help-config` and docs/training.md."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainer.api
from trainer.api.config import TrainerConfig
from trainer.config_doc import DOC, as_markdown, documented, sections

REPO = Path(__file__).resolve().parent.parent


def _fields(cls: type) -> list[dataclasses.Field]:
    out = []
    for f in dataclasses.fields(cls):
        out.append(f)
        if dataclasses.is_dataclass(f.default_factory):
            out += _fields(f.default_factory)  # type: ignore[arg-type]
    return out


def test_every_config_field_says_what_it_does() -> None:
    missing = [f.name for f in _fields(TrainerConfig) if len(f.metadata.get("help", "")) < 8]
    assert not missing, f"config fields without help: {missing}"


def test_docs_training_md_holds_the_generated_config_reference() -> None:
    assert documented(DOC.read_text()) == as_markdown(), (
        "docs/training.md's config reference differs from the fields' help: run "
        "`python -m trainer.config_doc --write`"
    )


def test_every_key_is_in_the_reference_under_its_dotted_path() -> None:
    keys = {key for s in sections() for key, _, _ in s.fields}
    assert {"train.lr", "rollout.agent.mode", "gateway.engine", "eval.size", "seed"} <= keys
    assert "gateway.admin_key" in keys and "rollout.agent" not in keys  # sections aren't keys


def test_help_config_prints_sections_with_defaults_and_no_secret() -> None:
    env = {**os.environ, "TURNSTILE_ADMIN_KEY": "do-not-print-me"}
    out = subprocess.run(
        [sys.executable, "-m", "trainer.cli", "train", "--help-config"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "[train]  the algorithm and the optimizer" in out
    assert "  train.lr = 1e-05\n      AdamW learning rate" in out
    assert "  rollout.agent.mode = inline\n" in out
    assert "gateway.admin_key = $TURNSTILE_ADMIN_KEY" in out
    assert "do-not-print-me" not in out


def test_list_and_dict_defaults_are_not_shared_between_configs() -> None:
    a, b = TrainerConfig(), TrainerConfig()
    a.imports.append("x.py")
    a.rollout.agent.resources["sandbox"] = 1
    a.trackers.backends.append("wandb")
    assert b.imports == [] and b.rollout.agent.resources == {}
    assert b.trackers.backends == ["tensorboard"]


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("RolloutWorkflow", "trainer.api.workflow"),
        ("AgentWorkflow", "trainer.api.workflow"),
        ("Agent", "trainer.api.agent"),
        ("EnvironmentService", "trainer.api.agent"),
        ("BundledGenerationOutputs", "trainer.api.agent"),
        ("LLMRequest", "trainer.api.io_struct"),
        ("GenerationHyperparameters", "trainer.api.io_struct"),
        ("TrainEngine", "trainer.api.train_engine"),
        ("TrainConfig", "trainer.api.config"),
    ],
)
def test_each_contract_lives_in_the_api_package(name: str, module: str) -> None:
    assert getattr(trainer.api, name).__module__ == module


def test_every_name_of_the_surface_resolves() -> None:
    for name in trainer.api.__all__:
        assert getattr(trainer.api, name) is not None
    with pytest.raises(AttributeError, match="trainer.api has no 'Nope'"):
        trainer.api.Nope  # noqa: B018


def test_registration_decorators_are_the_registries_own() -> None:
    from gateway.samples import EXPORT_STYLES
    from trainer.algorithm.losses import get_loss

    @trainer.api.register_loss("api-test-loss")
    def my_loss(logprobs, mb, cfg):  # type: ignore[no-untyped-def]
        return logprobs.sum(), {}

    try:
        assert get_loss("api-test-loss") is my_loss
        assert trainer.api.register_export_style.__self__ is EXPORT_STYLES  # type: ignore[attr-defined]
    finally:
        from trainer.api.registry import LOSSES

        LOSSES.pop("api-test-loss", None)


def test_the_demo_agents_are_agent_workflows() -> None:
    demo = trainer.api.import_file(REPO / "agents" / "math_multi_turn.py")
    sync = trainer.api.import_file(REPO / "agents" / "math_sync_openai.py")
    for module in (demo, sync):
        agents = [
            v for v in vars(module).values()
            if isinstance(v, type) and callable(getattr(v, "run", None))
        ]  # fmt: skip
        assert agents and all(issubclass(a, trainer.api.AgentWorkflow) for a in agents)
    assert not issubclass(int, trainer.api.AgentWorkflow)


def test_an_agent_file_that_registers_an_environment_does_not_load_torch() -> None:
    code = (
        "import sys\n"
        "from trainer.api import EnvironmentService, register_env, import_file, LLMRequest\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_a_removed_key_says_what_became_of_it() -> None:
    from trainer.api import ConfigError, load_config

    with pytest.raises(ConfigError, match="log_every was removed: nothing read it"):
        load_config(None, ["log_every=5"])
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['nope'\] in train"):
        load_config(None, ["train.nope=1"])
