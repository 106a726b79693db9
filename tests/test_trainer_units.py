"""Trainer building blocks: returns over a branching session, GRPO advantages, packing, losses, config."""

from __future__ import annotations

import random
import textwrap

import pytest
import torch
import yaml
from trainer_helpers import tiny_llama

from gateway.samples import NoRewardError, discounted_returns
from gateway.samples.individual import individual_samples
from trainer.algorithm.advantages import get_advantage
from trainer.algorithm.losses import ppo_clip_loss, reinforce_loss
from trainer.api.config import ConfigError, TrainConfig, load_config
from trainer.backend.batches import micro_batches, pad_sequences, split_padded
from trainer.backend.functional import forward_logits, next_token_logprobs, predicting_positions
from trainer.rollout.agent_runner import RewardShapeError, rewards_from_return


def _c(cid: str, parent: str | None, reward: float | None, t: float = 0.0) -> dict:
    return {
        "id": cid,
        "parent_id": parent,
        "reward": reward,
        "created_at": t,
        "prompt_ids": [1, 2, 3],
        "output_ids": [4, 5],
        "output_logprobs": [-0.1, -0.2],
        "output_versions": [7, 7],
        "finish_reason": "stop",
    }


# root -> a -> a1 (reward 1.0)
#      \-> b (reward 0.0)       (the agent branched after the first turn)
TREE = [
    _c("root", None, None, 0),
    _c("a", "root", None, 1),
    _c("b", "root", 0.0, 2),
    _c("a1", "a", 1.0, 3),
]


def test_returns_follow_each_branch_of_the_tree() -> None:
    g = 0.5
    r = discounted_returns(TREE, g)
    assert r["a1"] == pytest.approx(1.0)
    assert r["a"] == pytest.approx(0.0 + g * 1.0)
    assert r["b"] == pytest.approx(0.0)
    # a node with two children takes the mean of its branches' returns
    assert r["root"] == pytest.approx(g * (r["a"] + r["b"]) / 2)


def test_returns_do_not_depend_on_insertion_order() -> None:
    expected = discounted_returns(TREE, 0.9)
    for seed in range(5):
        shuffled = TREE[:]
        random.Random(seed).shuffle(shuffled)
        assert discounted_returns(shuffled, 0.9) == pytest.approx(expected)


def test_linear_chain_discount() -> None:
    chain = [_c("t1", None, None), _c("t2", "t1", None), _c("t3", "t2", 1.0)]
    r = discounted_returns(chain, 0.9)
    assert [r["t1"], r["t2"], r["t3"]] == pytest.approx([0.81, 0.9, 1.0])


def test_individual_samples_mask_the_prompt_and_keep_logprobs_and_versions() -> None:
    samples = individual_samples("s", TREE, 1.0)
    assert len(samples) == 4
    s = samples[0]
    assert s.input_ids == [1, 2, 3, 4, 5]
    assert s.loss_mask == [0, 0, 0, 1, 1]
    assert s.logprobs[3:] == [-0.1, -0.2]
    assert s.versions == [-1, -1, -1, 7, 7]


def test_session_without_any_reward_is_refused() -> None:
    with pytest.raises(NoRewardError):
        individual_samples("s", [_c("x", None, None)], 1.0)


def test_float_reward_goes_to_last_completion_and_dict_by_id() -> None:
    comps = [_c("first", None, None, 1.0), _c("last", "first", None, 2.0)]
    assert rewards_from_return(1, comps) == {"last": 1.0}
    assert rewards_from_return(True, comps) == {"last": 1.0}
    assert rewards_from_return({"first": 0.5, "last": 1}, comps) == {"first": 0.5, "last": 1.0}
    with pytest.raises(RewardShapeError):
        rewards_from_return({"someone-else": 1.0}, comps)
    with pytest.raises(RewardShapeError):
        rewards_from_return(float("nan"), comps)


def grpo_advantages(returns: list[float], groups: list[int], norm: str) -> list[float]:
    r = torch.tensor(returns)
    batch = {"returns": r, "group": torch.tensor(groups), "token_returns": r[:, None]}
    return get_advantage("grpo")(batch, TrainConfig(adv_norm=norm))[:, 0].tolist()


def test_grpo_advantages_are_normalised_within_each_group() -> None:
    returns = [1.0, 0.0, 0.0, 0.0, 0.5, 0.5]
    groups = [0, 0, 0, 0, 1, 1]
    adv = grpo_advantages(returns, groups, "group")
    assert sum(adv[:4]) == pytest.approx(0.0, abs=1e-9)
    assert adv[0] > 0 > adv[1]
    assert adv[0] == pytest.approx(
        (1 - 0.25) / torch.tensor([1.0, 0, 0, 0]).std(unbiased=False).item(), rel=1e-4
    )
    # a group where everyone scored the same carries no signal
    assert adv[4:] == [0.0, 0.0]
    none = grpo_advantages(returns, groups, "none")
    assert none[:4] == pytest.approx([0.75, -0.25, -0.25, -0.25])


def _sample(n: int, prompt: int, seed: int) -> dict:
    rng = random.Random(seed)
    return {
        "input_ids": [rng.randrange(10, 500) for _ in range(n)],
        "loss_mask": [0] * prompt + [1] * (n - prompt),
        "logprobs": [0.0] * prompt + [-1.0] * (n - prompt),
        "versions": [-1] * prompt + [3] * (n - prompt),
    }


def pack(samples: list[dict], advantages: list[float], max_tokens: int) -> list[dict]:
    """As the actor packs samples: padded, unpadded into micro-batches, a logits_mask."""
    seqs = [
        {
            "input_ids": torch.tensor(s["input_ids"]),
            "loss_mask": torch.tensor(s["loss_mask"]),
            "logprobs": torch.tensor(s["logprobs"]),
            "advantages": torch.full((len(s["input_ids"]),), a),
        }
        for s, a in zip(samples, advantages, strict=True)
    ]
    mbs = micro_batches(split_padded(pad_sequences(seqs)), max_tokens)
    return [{**mb, "logits_mask": predicting_positions(mb["loss_mask"])} for mb in mbs]


def token_logprobs(model: torch.nn.Module, mb: dict) -> torch.Tensor:
    return next_token_logprobs(forward_logits(model, mb), mb)


def test_pack_puts_sequences_end_to_end_without_padding() -> None:
    samples = [_sample(10, 4, 0), _sample(7, 3, 1), _sample(12, 5, 2)]
    batches = pack(samples, [1.0, -1.0, 0.5], max_tokens=20)
    assert sum(b["input_ids"].numel() for b in batches) == 29  # no padding anywhere
    assert all(b["input_ids"].numel() <= 20 for b in batches)
    for b in batches:
        starts = (b["position_ids"] == 0).nonzero().flatten().tolist()
        assert starts == b["cu_seqlens"][:-1].tolist()
        assert all(b["loss_mask"][s] == 0 for s in starts)


class TinyLM(torch.nn.Module):
    """A causal LM small enough to check packing exactly: attention needs position ids."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = tiny_llama(512, 64).eval()

    def forward(self, **kw):  # type: ignore[no-untyped-def]
        return self.lm(**kw)


def test_packed_logprobs_equal_one_sequence_at_a_time() -> None:
    model = TinyLM()
    samples = [_sample(10, 4, 0), _sample(7, 3, 1), _sample(12, 5, 2)]
    (batch,) = pack(samples, [0.0, 0.0, 0.0], max_tokens=64)
    with torch.no_grad():
        packed = token_logprobs(model, batch)
        offset = 0
        for i in range(3):  # a micro-batch keeps its samples in their given order
            ids = torch.tensor([samples[i]["input_ids"]])
            logp = torch.log_softmax(model(input_ids=ids).logits[0], -1)
            n = ids.shape[1]
            ref = logp[:-1].gather(1, ids[0, 1:, None]).squeeze(1)
            p = samples[i]["loss_mask"].index(1)
            got = packed[offset + p : offset + n]
            assert torch.allclose(got, ref[p - 1 :], atol=1e-5)
            offset += n
        # the LM head on every position gives the same logprobs where tokens are trained
        full = {k: v for k, v in batch.items() if k != "logits_mask"}
        trained = batch["loss_mask"] > 0
        assert torch.allclose(token_logprobs(model, full)[trained], packed[trained], atol=1e-5)


def test_ppo_loss_on_a_tiny_packed_batch() -> None:
    model = TinyLM()
    samples = [_sample(10, 4, 0), _sample(8, 3, 1)]
    (batch,) = pack(samples, [1.0, -1.0], max_tokens=64)
    with torch.no_grad():
        old = token_logprobs(model, batch)
    logp = token_logprobs(model, batch)
    loss_sum, stats = ppo_clip_loss(logp, old, batch["advantages"], batch["loss_mask"], 0.2)
    # on-policy: ratio is 1, so the loss equals minus the masked sum of advantages
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert float(loss_sum.detach()) == pytest.approx(
        -float((batch["advantages"] * batch["loss_mask"]).sum()), abs=1e-4
    )
    loss_sum.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)

    # pushing the probabilities of positive-advantage tokens up lowers the loss
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    opt.step()
    with torch.no_grad():
        after, _ = ppo_clip_loss(
            token_logprobs(model, batch), old, batch["advantages"], batch["loss_mask"], 0.2
        )
    assert float(after) < float(loss_sum.detach())


def test_clipping_stops_the_gradient_past_the_trust_region() -> None:
    logp = torch.tensor([0.0, -0.1], requires_grad=True)
    old = torch.tensor([0.0, -1.0])  # second token: ratio e^0.9 >> 1.2
    adv = torch.tensor([1.0, 1.0])
    mask = torch.tensor([1.0, 1.0])
    loss, stats = ppo_clip_loss(logp, old, adv, mask, 0.2)
    loss.backward()
    assert logp.grad is not None and logp.grad[1] == 0 and logp.grad[0] != 0
    assert stats["clip_frac"] == pytest.approx(0.5)


def test_reinforce_loss_sign() -> None:
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, _ = reinforce_loss(logp, torch.tensor([1.0, -1.0]), torch.tensor([1.0, 1.0]))
    loss.backward()
    assert logp.grad.tolist() == [-1.0, 1.0]


def test_the_saved_config_holds_no_admin_key(tmp_path) -> None:
    """config.yaml in the run folder (and the trackers' copy) leave the admin and signing
    keys out."""
    path = tmp_path / "c.yaml"
    path.write_text("gateway: {admin_key: s3cret-admin, signing_keys: s3cret-signing, port: 0}\n")
    cfg = load_config(path, [])
    assert cfg.gateway.admin_key == "s3cret-admin"
    saved = yaml.safe_dump(cfg.without_secrets())
    assert "s3cret-admin" not in saved and yaml.safe_load(saved)["gateway"]["port"] == 0
    assert "s3cret-signing" not in saved  # the deployment's thinking-signature keys


def test_config_yaml_with_overrides(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(
            """
            total_steps: 3
            rollout: {group_size: 4, agent: {turn_discount: 0.9}}
            train: {lr: 1.0e-5}
            """
        )
    )
    cfg = load_config(
        path, ["train.lr=2e-6", "rollout.agent.export_style=individual", "total_steps=5"]
    )
    assert cfg.total_steps == 5 and cfg.rollout.group_size == 4
    assert cfg.train.lr == pytest.approx(2e-6)
    assert cfg.rollout.agent.turn_discount == pytest.approx(0.9)
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(path, ["rollout.grup_size=3"])
    with pytest.raises(ConfigError, match="number"):
        load_config(path, ["train.lr=fast"])


def test_padded_batches_round_trip_to_packed_micro_batches() -> None:
    seqs = [
        {"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([0, 1, 1]), "r": 0.5},
        {"input_ids": torch.arange(10, 15), "loss_mask": torch.tensor([0, 0, 1, 1, 1]), "r": -1},
    ]
    batch = pad_sequences(seqs)
    assert batch["input_ids"].shape == (2, 5) and batch["r"].tolist() == [0.5, -1.0]
    assert batch["attention_mask"].sum(1).tolist() == [3, 5]
    back = split_padded(batch)
    assert [b["input_ids"].tolist() for b in back] == [[5, 6, 7], [10, 11, 12, 13, 14]]
    assert [float(b["r"]) for b in back] == [0.5, -1.0]
    (mb,) = micro_batches(back, max_tokens=64)
    assert mb["input_ids"].tolist() == [5, 6, 7, 10, 11, 12, 13, 14]
    assert mb["cu_seqlens"].tolist() == [0, 3, 8]
    assert mb["position_ids"].tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert mb["loss_mask"].tolist() == [0, 1, 1, 0, 0, 1, 1, 1]
    assert len(micro_batches(back, max_tokens=5)) == 2  # the budget splits them
    with pytest.raises(ValueError, match="attention_mask"):
        split_padded({"input_ids": batch["input_ids"]})
