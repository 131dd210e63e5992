"""Parity of MOON's local step with the authors' ``train_net_fedcon`` (QinbinLi/MOON; fixture:
``python -m parity.moon``, see its docstring): the model-contrastive loss against a frozen global and
previous model, cross-entropy on the projected z, the step's loss and every gradient."""

from __future__ import annotations

import contextlib
import copy
import types

import torch

from fedstyle.algorithms.moon import MOON, model_contrastive_loss
from fedstyle.models.base import Classifier
from parity import moon as generator
from parity.common import read_fixture, relative_error

from parity_steps import checked_settings, compare_step, run_step, seeded_model

FIXTURE = read_fixture("moon")
S = generator.SETTINGS
HP = {"mu": S["mu"], "tau": S["temperature"], "out_dim": S["out_dim"]}
#: measured: 0 (bitwise: the same operations in the same order)
TOLERANCE = {"loss": 1e-5, "grad": 1e-5}


def model(algo: MOON, role: str) -> Classifier:
    """fedstyle's model with the weights the generator gave the authors' net ``role``."""
    net = Classifier(generator.backbone(), S["classes"])
    algo.configure_model(net)
    names = {generator.fedstyle_name(k): k for k in FIXTURE.group(f"weight_sum/{role}/")}
    seeded_model(net, names, FIXTURE, prefix=f"weight_sum/{role}/", seed=S["seeds"][role])
    return net


def frozen(net: Classifier) -> Classifier:
    net = copy.deepcopy(net).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def test_fixture_provenance_and_settings():
    assert checked_settings(FIXTURE, generator) == S


def test_training_step_matches_train_net_fedcon():
    algo = MOON(HP, num_classes=S["classes"], num_clients=1)
    local = model(algo, "local").train()
    global_model = frozen(model(algo, "global"))
    previous = model(algo, "previous")
    x, y = generator.batch()
    assert torch.equal(y, FIXTURE["y"])
    logged = {}
    ctx = types.SimpleNamespace(client_id=0, state={f"moon/prev/{k}": v for k, v in previous.state_dict().items()},
                                scratch={}, global_model=lambda: global_model,
                                timed=lambda name: contextlib.nullcontext(),
                                log=lambda name, value: logged.__setitem__(name, value))
    ctx.scratch["moon/previous"] = algo.previous_model(ctx, local)  # the runtime's path: the stored state, frozen
    step = run_step(algo, local, x, y, ctx=ctx, hooks=())
    result = compare_step(FIXTURE, step, "k1/", grad_prefix="grad/", ce=logged["moon_ce"], con=logged["moon_con"])
    assert max(result.errors.values()) <= TOLERANCE["loss"], result.errors  # ce, con, the step's loss
    assert result.grad <= TOLERANCE["grad"], result.worst_grad


def test_contrastive_loss_with_two_previous_models():
    algo = MOON(HP, num_classes=S["classes"], num_clients=1)
    local = model(algo, "local").train()
    x, _ = generator.batch()
    with torch.no_grad():
        z = local.features(x)
        z_glob = frozen(model(algo, "global")).features(x)
        z_prev = torch.stack([frozen(model(algo, r)).features(x) for r in ("previous", "previous2")], dim=1)
    con = model_contrastive_loss(z, z_glob, z_prev, S["temperature"])
    assert relative_error(con.reshape(1), FIXTURE["k2/con"]) <= TOLERANCE["loss"]
