"""The ``optim`` axis: every optimizer by name over the same two parameter groups (weight decay
on linear weights only), each built from its own keys; Lion's update checked against its
paper's rule; a user's optimizer registered like any component."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from blocklab import registry
from blocklab.config import ConfigError, OptimConfig, compose
from blocklab.config.validate import validate_optim
from blocklab.train.optim import Lion, build_optimizer


class Tiny(nn.Module):
    """An embedding, a norm and a linear layer with a bias: one decayed tensor (the weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.norm, self.out = nn.Embedding(5, 4), nn.LayerNorm(4), nn.Linear(4, 3)


@pytest.mark.parametrize("name", ["adamw", "sgd", "lion", "adafactor"])
def test_every_optimizer_keeps_the_weight_decay_groups(name):
    cfg = compose("train", [f"optim={name}", "optim.weight_decay=0.25"]).optim
    model = Tiny()
    opt = build_optimizer(model, OptimConfig(**cfg))
    decay, no_decay = opt.param_groups
    assert [id(p) for p in decay["params"]] == [id(model.out.weight)]
    assert {id(p) for p in no_decay["params"]} == {id(p) for n, p in model.named_parameters()
                                                    if n != "out.weight"}
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.25, 0.0)
    assert decay["lr"] == cfg.lr
    kind = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "lion": Lion,
            "adafactor": torch.optim.Adafactor}[name]
    assert type(opt) is kind
    model.out(model.norm(model.emb(torch.tensor([1, 2])))).sum().backward()
    before = model.norm.weight.detach().clone()
    opt.step()  # every optimizer steps; the no-decay group is moved by its gradient only
    assert not torch.equal(before, model.norm.weight)


def test_sgd_takes_its_momentum_and_nesterov_keys():
    opt = build_optimizer(Tiny(), OptimConfig(name="sgd", lr=0.1, momentum=0.8, nesterov=True))
    assert (opt.defaults["momentum"], opt.defaults["nesterov"]) == (0.8, True)
    with pytest.raises(ConfigError, match=r"optim\.nesterov"):
        validate_optim(OptimConfig(name="sgd", momentum=0.0, nesterov=True))
    with pytest.raises(ConfigError, match=r"optim\.momentum"):
        validate_optim(OptimConfig(name="sgd", momentum=1.0))


def test_lion_follows_the_papers_update():
    """theta -= lr * (sign(b1 m + (1 - b1) g) + wd theta); m = b2 m + (1 - b2) g."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(6))
    opt = Lion([{"params": [p], "weight_decay": 0.5}], lr=0.01, betas=(0.9, 0.99))
    theta, m = p.detach().clone(), torch.zeros(6)
    for _ in range(3):
        g = torch.randn(6)
        p.grad = g.clone()
        opt.step()
        theta = theta - 0.01 * (torch.sign(0.9 * m + 0.1 * g) + 0.5 * theta)
        m = 0.99 * m + 0.01 * g
        torch.testing.assert_close(p.detach(), theta, rtol=1e-6, atol=1e-7)


def test_a_registered_optimizer_is_chosen_by_name_and_unknown_names_list_the_choices():
    def plain_sgd(groups, cfg):
        return torch.optim.SGD(groups, lr=cfg.lr)

    registry.register("optim", "plain_sgd")(plain_sgd)
    try:
        validate_optim(OptimConfig(name="plain_sgd"))
        opt = build_optimizer(Tiny(), OptimConfig(name="plain_sgd", weight_decay=0.3))
        assert type(opt) is torch.optim.SGD and opt.param_groups[0]["weight_decay"] == 0.3
    finally:
        registry.table("optim").pop("plain_sgd", None)
        registry._registered.pop(("optim", "plain_sgd"), None)
    with pytest.raises(ConfigError, match=r"optim.name.*adafactor, adamw, lion, sgd"):
        validate_optim(OptimConfig(name="sgdx"))
