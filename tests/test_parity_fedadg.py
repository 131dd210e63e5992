"""Parity of fedadg with FedADG's public code (mirror Haoxiang-Wang/FedADG; fixture: ``python -m parity.fedadg``).

One local step through ``FedADG.local_train`` (the base loop over one batch, ``ce_warmup=0``) on fedstyle's
ConvNet with the generator's seeded weights, the authors' noise fed to fedstyle's ``torch.rand`` draw: the four
losses and the gradients of the three optimiser steps (D on L_advd; F and C on 0.85 CE + 0.15 L_advf through the
updated D; G on L_advg), each read when its step is taken. Their ``LabelSmoothingLoss(s)`` puts s / (K - 1) on
each wrong class, torch's ``label_smoothing`` s' / K on every class: the same loss at s' = s K / (K - 1).
"""

from __future__ import annotations

import torch

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.context import TrainSettings
from fedstyle.models import build_model
from parity import fedadg as generator
from parity.common import gradient_errors

from parity_steps import (checked_settings, client_context, load_authors_state, parity_fixture, placeholder_data,
                          relative_errors)

FEDSTYLE_NAMES = {**generator.GENERATOR_NAMES, **generator.DISCRIMINATOR_NAMES}
fixture = parity_fixture("fedadg")


def test_fixture_is_the_generators(fixture):
    settings = checked_settings(fixture, generator)
    assert {k: settings[k] for k in generator.SETTINGS} == {k: list(v) if isinstance(v, tuple) else v
                                                            for k, v in generator.SETTINGS.items()}
    assert torch.equal(fixture["labels"], generator.batch()[1])


def test_one_local_step_matches(fixture, monkeypatch):
    k = generator.NUM_CLASSES
    lr_task, lr_adv = float(fixture["lr/task"]), float(fixture["lr/discriminator"])
    assert float(fixture["lr/generator"]) == lr_adv
    algo = METHODS.get("fedadg")({
        "noise_dim": generator.NOISE, "rp_size": generator.RP, "gen_hidden": generator.GENERATOR_HIDDEN,
        "disc_hidden": generator.DISCRIMINATOR_HIDDEN, "onehot": 0.7, "lambda_adv": 1 - generator.ALPHA,
        "adv_lr_scale": lr_adv / lr_task, "ce_warmup": 0.0, "label_smoothing": generator.LABEL_SMOOTHING * k / (k - 1),
    }, num_classes=k, num_clients=3)
    torch.manual_seed(0)
    model = build_model("convnet", k, generator.SIZE)
    algo.configure_model(model)
    load_authors_state(model, generator.model_state(), fixture, lambda name: FEDSTYLE_NAMES.get(name, name),
                       approx=1e-12)
    model.train()

    x, y = generator.batch()
    noise, rand = fixture["noise"], torch.rand
    monkeypatch.setattr(torch, "rand", lambda *size, **kw: noise.clone() if size == tuple(noise.shape) else
                        rand(*size, **kw))
    monkeypatch.setattr(algo, "training_batches", lambda ctx: iter([(x, y)]))
    steps, sgd_step = [], torch.optim.SGD.step
    names = {id(p): n for n, p in model.named_parameters()}

    def recording_step(self, *a, **kw):
        steps.append({names[id(p)]: p.grad.detach().clone() for group in self.param_groups for p in group["params"]
                      if p.grad is not None})
        return sgd_step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.SGD, "step", recording_step)
    ctx = client_context(placeholder_data(y, generator.SIZE), num_clients=3,
                         train=TrainSettings(lr=lr_task, batch_size=len(y), local_steps=1, momentum=generator.MOMENTUM,
                                             weight_decay=generator.WEIGHT_DECAY))
    result = algo.local_train(ctx, model, {})

    logged = result.metrics
    errors = relative_errors(fixture, "loss/", **{name: torch.tensor([logged[f"fedadg_{name}"]])
                                                  for name in ("ce", "adv_d", "adv_f", "adv_g")},
                             total=torch.tensor([result.train_loss]))
    assert max(errors.values()) < 1e-5, errors

    assert len(steps) == 3
    authors = {v: k for k, v in FEDSTYLE_NAMES.items()}
    for prefix, grads in zip(("d_step/", "task_step/", "g_step/"), steps):
        errs = gradient_errors(fixture.tensors, {authors.get(n, n): g for n, g in grads.items()}, prefix=prefix)
        assert max(errs.values()) < 1e-4, (prefix, {n: e for n, e in errs.items() if e >= 1e-4})
