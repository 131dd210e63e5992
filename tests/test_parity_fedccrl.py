"""Parity of FedCCRL's ``reference_code`` mode with the authors' client code (fixture: ``python -m parity.fedccrl``;
see its docstring for what their code ran on): each client's uploaded statistics, client 0's pool, and two local
steps — MixStyle towards the pool with their draws replayed, the 8-bit round trip around AugMix (their AugMix and
fedstyle's both stood in by the identity), CE on all views, SupCon and JS — their losses and every gradient."""

from __future__ import annotations

import pytest
import torch

from fedstyle.algorithms import METHODS, fedccrl
from fedstyle.algorithms.context import ClientContext, ServerContext, TrainSettings
from fedstyle.algorithms.fedccrl import MU, SIGMA
from fedstyle.data.augment.common import Normalization
from fedstyle.data.client import ClientData
from parity import fedccrl as generator
from parity.common import read_fixture, relative_error

from parity_steps import assert_weight_sums, checked_settings

FIXTURE = read_fixture("fedccrl")
ARGS = generator.ARGS
#: float32, the same statistics (the code's torch.var against a two-pass 1/(HW - 1) variance), the same transfer
#: written as x * a + b against (x - mu) / sigma * sigma_mix + mu_mix, logsumexp against log(sum exp - exp(diagonal)):
#: measured statistics 6.5e-8, pool 3.6e-8, losses 0 and 2.1e-7, gradients 1.2e-6 and 1.1e-6 (steps 1, 2)
TOLERANCE = {"stats": 1e-6, "loss": 1e-5, "grad": 1e-4}


def _algo(reference=True):
    options = {"reference_code": reference, "upload_ratio": ARGS["r"], "lambda1": ARGS["lambda1"],
               "lambda2": ARGS["lambda2"], "temperature": ARGS["t"], "mix_p": ARGS["p"]}
    return METHODS.get("fedccrl")(options, num_classes=generator.SETTINGS["classes"],
                                  num_clients=generator.SETTINGS["clients"])


def _clients():
    return [ClientData(FIXTURE[f"images{i}"], FIXTURE[f"labels{i}"], torch.full((16,), i), generator.transform())
            for i in range(generator.SETTINGS["clients"])]


def _ctx(data, cid, phase):
    return ClientContext(cid, data, {}, TrainSettings(lr=generator.SETTINGS["lr"], batch_size=8), 0,
                         generator.SETTINGS["clients"], torch.device("cpu"), 0, phase=phase)


def test_fixture_provenance_and_inputs():
    assert checked_settings(FIXTURE, generator) == generator.SETTINGS
    assert_weight_sums(generator.build_model().state_dict(), FIXTURE)
    for i, (images, labels) in enumerate(generator.data()):
        assert torch.equal(images, FIXTURE[f"images{i}"]) and torch.equal(labels, FIXTURE[f"labels{i}"])


def _queries(algo, monkeypatch):
    """Each client's query with the code's choice of images forced: the loader's first floor(r n) (unshuffled here)."""
    model = generator.build_model().eval()
    monkeypatch.setattr(torch, "randperm", lambda n, generator=None, __real=torch.randperm: torch.arange(n))
    out = {i: algo.round_query(_ctx(data, i, "query"), model) for i, data in enumerate(_clients())}
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("reference", [True, False])
def test_uploaded_statistics_and_the_pool_match_the_authors_code(reference, monkeypatch):
    """reference_code (torch.var's 1/(HW - 1)) matches; the paper's MixStyle variance, 1/HW, does not."""
    algo = _algo(reference)
    queries = _queries(algo, monkeypatch)
    errors = [max(relative_error(queries[i][MU], FIXTURE[f"stats{i}/mu"]),
                  relative_error(queries[i][SIGMA], FIXTURE[f"stats{i}/sigma"])) for i in queries]
    server = ServerContext(weights={}, state={}, round=0, num_clients=3, seed=0)
    pool = algo.round_payloads(server, [0, 1, 2], queries)[0]
    pool_error = max(relative_error(pool[MU], FIXTURE["pool/mu"]), relative_error(pool[SIGMA], FIXTURE["pool/sigma"]))
    if reference:
        assert max(errors) < TOLERANCE["stats"] and pool_error < TOLERANCE["stats"], (max(errors), pool_error)
    else:  # 16 x 16 maps: sigma differs by sqrt(256 / 255), 0.2 %
        assert max(errors) > 1e-3


class _Identity:
    """fedstyle's side of the code's AugMix stand-in (the quantisations around it are fedstyle's own)."""

    norm = Normalization(*generator.IMAGENET)

    def __call__(self, x):
        return x


@pytest.mark.parametrize("reference", [True, False])
def test_two_local_steps_match_the_authors_code(reference, monkeypatch):
    """Losses and every gradient of both steps; without reference_code (1/HW variances in the transfer, no anchor
    among its own SupCon positives, no 8-bit round trip) the first loss is off."""
    algo = _algo(reference)
    model = generator.build_model().train()
    data = _clients()[0]
    payload = {MU: FIXTURE["pool/mu"], SIGMA: FIXTURE["pool/sigma"]}
    draws = []
    monkeypatch.setattr(fedccrl, "pool_indices", lambda pool, count: draws.pop(0)[0])
    monkeypatch.setattr(algo.mix, "sample_mix_weights", lambda b, like: draws.pop(0)[1].view(b, 1, 1, 1).to(like.dtype))
    monkeypatch.setattr(algo, "_augmentation", lambda transform: _Identity())
    cast, levels = [], []
    real_quantize = fedccrl.quantize

    def code_pixels(x, norm, slack=0.0):
        """The cast before AugMix: fedstyle's levels against the code's (the restyle's float32 rounding moves a pixel
        across a level now and then, one level), then the code's pixels, so that what follows compares exactly."""
        if slack:
            return real_quantize(x, norm, slack)
        theirs = cast.pop(0).float()
        levels.append((torch.floor(norm.to_pixels(x) * 255.0) - theirs).abs())
        return norm.from_pixels(theirs / 255.0)

    if reference:
        monkeypatch.setattr(fedccrl, "quantize", code_pixels)
    ctx = _ctx(data, 0, "train")
    for step in range(2):
        for view in range(2):
            draws += [(FIXTURE[f"step{step}/view{view}/rows"][:8], None),
                      (None, FIXTURE[f"step{step}/view{view}/lambda"])]
            cast.append(FIXTURE[f"step{step}/view{view}/uint8"])
        x = data.transform(data.images[8 * step:8 * step + 8], train=False)
        loss = algo.training_loss(ctx, model, x, data.labels[8 * step:8 * step + 8], payload)
        model.zero_grad()
        loss.backward()
        loss_error = relative_error(loss, FIXTURE[f"step{step}/loss"])
        if not reference:
            assert loss_error > 1e-3
            return
        grad_error = max(relative_error(p.grad, FIXTURE[f"step{step}/grad/{k}"]) for k, p in
                         model.named_parameters())
        assert loss_error < TOLERANCE["loss"] and grad_error < TOLERANCE["grad"], (step, loss_error, grad_error)
        differing = torch.cat([d.flatten() for d in levels])
        assert differing.max() <= 1 and float((differing > 0).float().mean()) < 1e-3  # measured 1 pixel in 6144
        with torch.no_grad():  # the generator's plain SGD step
            for p in model.parameters():
                p -= generator.SETTINGS["lr"] * p.grad
