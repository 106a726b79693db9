"""Losses and advantage estimators by name; the built-in actor trains through train_batch.

A Trainer run with a loss registered outside the package is in test_trainer_modes.py.
"""

from __future__ import annotations

import pytest
import torch

from trainer.algorithm.actor import PPOActor, to_sequences
from trainer.algorithm.advantages import get_advantage
from trainer.algorithm.losses import get_loss
from trainer.api.config import ConfigError, TrainConfig
from trainer.backend.batches import pad_sequences
from trainer.rollout.agent_runner import Episode


def test_unknown_names_list_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"train\.loss 'nope'.*'grpo', 'ppo', 'reinforce'"):
        get_loss("nope")
    with pytest.raises(ConfigError, match=r"train\.advantage 'nope'.*'grpo'"):
        get_advantage("nope")


def _gateway_sample(returns: float, token_returns: list[float] | None = None) -> dict:
    return {
        "input_ids": [1, 2, 3, 4],
        "loss_mask": [0, 0, 1, 1],
        "logprobs": [0.0, 0.0, -0.5, -0.7],
        "versions": [-1, -1, 3, 3],
        "returns": returns,
        "token_returns": token_returns,
        "temperature": 0.7,
        "meta": {"turns": 1},
    }


def test_every_rollout_kind_becomes_the_same_batch() -> None:
    workflow = {"input_ids": torch.tensor([5, 6, 7]), "rewards": torch.tensor([0.0, 0.0, 1.0])}
    episodes = [
        Episode(group=0, session_id="http", samples=[_gateway_sample(1.0, [0, 0, 1.0, 0.5])]),
        Episode(
            group=1,
            session_id="token",
            samples=[{**_gateway_sample(0.0), "input_ids": [5, 6, 7], "loss_mask": [0, 1, 1],
                      "logprobs": [0.0, -1.0, -1.0], "versions": [-1, 3, 3]}],
            raw=[{**workflow, "tag": "not a number", "matrix": torch.zeros(3, 2)}],
        ),
    ]  # fmt: skip
    seqs = to_sequences(episodes)
    assert seqs[1]["rewards"].tolist() == [0.0, 0.0, 1.0]  # the workflow's own key
    assert "tag" not in seqs[1] and "matrix" not in seqs[1]  # not one value per token
    batch = pad_sequences(seqs)
    assert batch["input_ids"].shape == (2, 4) and batch["attention_mask"].sum().item() == 7
    assert batch["group"].tolist() == [0, 1] and batch["temperature"].tolist() == pytest.approx(
        [0.7, 0.7]
    )
    assert batch["token_returns"][0].tolist() == [0, 0, 1.0, 0.5]  # per-turn (concat)
    assert batch["token_returns"][1, :3].tolist() == [0.0, 0.0, 0.0]  # the scalar return
    assert "rewards" not in batch  # only the keys every sequence has


class RecordingEngine:
    """Stands in for DeepSpeedEngine: runs the loss on logits the actor asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict, object, object]] = []

    def train(self) -> None:
        pass

    def train_batch(self, data, loss_fn, loss_weight_fn):  # type: ignore[no-untyped-def]
        self.calls.append((data, loss_fn, loss_weight_fn))
        from trainer.backend.batches import micro_batches, split_padded

        (mb,) = micro_batches(split_padded(data), 1024)
        rows_ = int(mb["logits_mask"].sum())
        logits = torch.zeros(rows_, 16, requires_grad=True)
        loss, stats = loss_fn(logits, mb)
        return {"loss": float(loss), **stats, "weight": float(loss_weight_fn(mb))}


def _batch() -> dict[str, torch.Tensor]:
    episodes = [
        Episode(group=0, session_id=f"s{i}", samples=[_gateway_sample(r)])
        for i, r in enumerate([1.0, 0.0, 0.2])
    ] + [Episode(group=1, session_id="flat", samples=[_gateway_sample(0.2)])]
    return pad_sequences(to_sequences(episodes))


@pytest.mark.parametrize(("version", "stale"), [(3, False), (4, True)])
def test_the_actor_makes_the_user_call_and_recomputes_prox_when_stale(version, stale) -> None:
    engine = RecordingEngine()
    stats = PPOActor(engine, TrainConfig()).train(_batch(), version=version)  # type: ignore[arg-type]
    ((data, _, _),) = engine.calls
    # group 1 has one sample: no signal, so not trained on
    assert stats["num_samples"] == 4 and stats["num_trained_samples"] == 3
    assert data["input_ids"].shape[0] == 3
    # only the positions predicting a trained token go through the LM head
    assert data["logits_mask"][0].tolist() == [False, True, True, False]
    assert stats["prox_recomputed"] == float(stale)
    assert stats["staleness_max"] == version - 3
    assert stats["weight"] == 6  # trained tokens
    # uniform logits: logp = -log 16 everywhere; behaviour logprobs differ from it
    assert stats["ratio_mean"] == pytest.approx(
        1.0
        if stale
        else float(torch.tensor([0.5, 0.7]).sub(torch.log(torch.tensor(16.0))).exp().mean())
    )


class TinyEngine:
    """A real (tiny, per-token) model with AdamW behind the TrainEngine calls."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.1)
        self.calls: list[dict] = []

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)

    def eval(self) -> None:
        self.model.eval()

    def _mbs(self, data):  # type: ignore[no-untyped-def]
        from trainer.backend.batches import micro_batches, split_padded

        return micro_batches(split_padded(data), 1024)

    def _logits(self, mb):  # type: ignore[no-untyped-def]
        return self.model(mb["input_ids"])[mb["logits_mask"]]

    def train_batch(self, data, loss_fn, loss_weight_fn):  # type: ignore[no-untyped-def]
        self.calls.append(data)
        self.optimizer.zero_grad()
        for mb in self._mbs(data):
            loss, stats = loss_fn(self._logits(mb), mb)
            loss.backward()
        self.optimizer.step()
        return {"loss": float(loss), "trained_tokens": float(loss_weight_fn(mb))}

    def eval_batch(self, data, loss_fn, loss_weight_fn):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            return sum(float(loss_fn(self._logits(mb), mb)) for mb in self._mbs(data))


@pytest.mark.parametrize("stale", [False, True])
def test_minibatches_are_updates_measured_against_the_step_start_policy(stale) -> None:
    from trainer.backend.functional import next_token_logprobs, predicting_positions

    engine = TinyEngine()
    batch = _batch()
    mask = batch["attention_mask"]
    with torch.no_grad():  # what the weights the step starts from give every token
        # the engine sampled at the batch's temperature: the logprobs are of that
        logits = (engine.model(batch["input_ids"]) / 0.7).log_softmax(-1)
        start = logits[:, :-1].gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    cfg = TrainConfig(ppo_n_minibatches=8)
    stats = PPOActor(engine, cfg).train(batch, version=4 if stale else 3)  # type: ignore[arg-type]
    # three samples carry signal: three updates of one sample each
    assert stats["updates"] == 3 and [int(c["input_ids"].shape[0]) for c in engine.calls] == [1] * 3
    assert stats["trained_tokens"] == 6  # all of them, summed over the updates
    for call in engine.calls:
        if not stale:  # on-policy: the behaviour logprobs are the reference
            assert "prox_logprobs" not in call
            continue
        # stale: every update is clipped against the step's starting weights, not
        # against the weights the previous update left
        row = int(torch.nonzero((batch["input_ids"] == call["input_ids"][0]).all(1))[0])
        trained = call["loss_mask"][0].bool() & mask[row]
        assert torch.allclose(call["prox_logprobs"][0, 1:][trained[1:]], start[row][trained[1:]])
    assert next_token_logprobs and predicting_positions  # the helpers the actor uses


def test_minibatch_count_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="ppo_n_minibatches"):
        TrainConfig(ppo_n_minibatches=0)
