"""FedCCRL (issue 38): the uploaded statistics, the server's pool, MixStyle towards it and the whole loss by hand
through a full forward pass (float64; the supervised contrastive and Jensen-Shannon terms written out as loops), the
privacy audit's surface against what the query sends, and runs: logs, resume, and Flower's ServerApp and ClientApp
against the simulator. The method x topology matrix runs it end to end (it is registered).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from fedstyle.algorithms import METHODS, fedccrl
from fedstyle.algorithms.consistency import supervised_contrastive
from fedstyle.algorithms.context import ClientContext, ServerContext
from fedstyle.algorithms.fedccrl import MU, SIGMA, quantize, upload_count
from fedstyle.data.augment.common import Normalization
from fedstyle.data.client import ClientData
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import run_experiment

from run_records import evaluations
from tiny import SETTINGS, TRANSFORM, interrupt_and_resume, make_clients, make_model
from flower_grid import run_under_flower  # noqa: E402  (Flower's apps, messages over the wire, in process)

CPU = torch.device("cpu")


class _Double:
    """The tiny transform, in float64 (the model is cast to float64 for the hand computations)."""

    mean, std = TRANSFORM.mean, TRANSFORM.std

    def __call__(self, x, train=True):
        return TRANSFORM(x, train=train).double()


def _ctx(data, phase="train", seed=0, cid=0) -> ClientContext:
    return ClientContext(client_id=cid, data=data, state={}, train=SETTINGS.train_settings(0), round=0, num_clients=3,
                         device=CPU, seed=seed, phase=phase)


def _data(n=20, seed=0):
    base = make_clients(1, per_client=n, seed=seed)[0]
    return ClientData(base.images, base.labels, base.domains, _Double())


def _stats_by_hand(x, unbiased):
    """Per image and channel: the mean and sqrt(var + 1e-6) over H x W, as loops over the images."""
    rows_mu, rows_sigma = [], []
    for image in x:
        flat = image.flatten(1)
        mu = flat.sum(1) / flat.shape[1]
        var = ((flat - mu[:, None]) ** 2).sum(1) / (flat.shape[1] - (1 if unbiased else 0))
        rows_mu.append(mu)
        rows_sigma.append((var + 1e-6).sqrt())
    return torch.stack(rows_mu), torch.stack(rows_sigma)


def _supcon_by_hand(views, originals, labels, tau, include_self):
    z = [v / v.norm() for v in torch.cat([views, originals])]
    y = torch.cat([labels, labels]).tolist()
    total = 0.0
    for i in range(len(z)):
        sims = [float(z[i] @ z[a]) / tau for a in range(len(z))]
        log_den = math.log(sum(math.exp(s) for a, s in enumerate(sims) if a != i))
        positives = [sims[p] for p in range(len(z)) if y[p] == y[i] and (p != i or include_self)]
        total += log_den - sum(positives) / len(positives)
    return total / len(z)


def _js_by_hand(logits):
    probs = [F.softmax(v, dim=1) for v in logits]
    mean = sum(probs) / len(probs)
    return sum(float((p * (p.log() - mean.log())).sum()) / p.shape[0] for p in probs) / len(probs)


@pytest.mark.parametrize("reference", [False, True])
def test_the_query_uploads_each_drawn_images_channel_mean_and_std(reference):
    algo, model = make_model("fedccrl", {"reference_code": reference, "upload_ratio": 0.25})
    data = _data(n=20)
    ctx = _ctx(data, phase="query", seed=5)
    answer = algo.round_query(ctx, model)
    m = upload_count(20, 0.25)
    assert m == 5 and upload_count(7, 0.1) == 1  # floor(r n), at least one image
    chosen = torch.randperm(20, generator=torch.Generator().manual_seed(5))[:m].sort().values
    mu, sigma = _stats_by_hand(data.transform(data.images[chosen], train=False), unbiased=reference)
    torch.testing.assert_close(answer[MU].double(), mu, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(answer[SIGMA].double(), sigma, rtol=1e-6, atol=1e-6)
    assert answer[MU].shape == (5, 3) and "fedccrl/query_seconds" in ctx.state


def test_the_server_sends_each_client_the_other_clients_latest_rows():
    algo, _ = make_model("fedccrl")
    server = ServerContext(weights={}, state={}, round=0, num_clients=3, seed=0)

    def rows(value, n):
        return {MU: torch.full((n, 3), value), SIGMA: torch.full((n, 3), -value)}

    out = algo.round_payloads(server, [0, 1, 2], {0: rows(0.0, 1), 1: rows(1.0, 2), 2: rows(2.0, 3)})
    assert out[0][MU][:, 0].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]  # clients 1 then 2, never its own
    assert out[2][SIGMA][:, 0].tolist() == [-0.0, -1.0, -1.0]
    # client sampling: client 1 answers again, the others keep their latest rows on the server
    out = algo.round_payloads(server, [1], {1: rows(5.0, 1)})
    assert set(out) == {1} and out[1][MU][:, 0].tolist() == [0.0, 2.0, 2.0, 2.0]
    assert algo.round_payloads(server, [0], {})[0][MU][:, 0].tolist() == [5.0, 2.0, 2.0, 2.0]
    lonely = ServerContext(weights={}, state={}, round=0, num_clients=3, seed=0)
    assert algo.round_payloads(lonely, [0], {0: rows(1.0, 2)}) == {}  # nobody else yet: nothing to restyle towards


def test_mixstyle_towards_the_pool_by_hand():
    """lambda 0: each image takes its drawn row's statistics exactly; lambda 1: unchanged; in between the formula."""
    algo, _ = make_model("fedccrl", {"perturb": "none"})
    data = _data(n=4)
    x = data.transform(data.images, train=False)
    pool = (torch.randn(3, 3, dtype=torch.float64), torch.rand(3, 3, dtype=torch.float64) + 0.5)
    rows = torch.tensor([2, 0, 1, 2])
    lam = torch.tensor([0.0, 1.0, 0.3, 0.8], dtype=torch.float64).view(4, 1, 1, 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fedccrl, "pool_indices", lambda pool_size, count: rows)
        mp.setattr(algo.mix, "sample_mix_weights", lambda b, like: lam)
        view, fired = algo.extend(_ctx(data), x, pool)
    assert fired
    mu, sigma = _stats_by_hand(x, unbiased=False)
    for i in range(4):
        l, j = float(lam[i]), int(rows[i])
        mu_mix, sigma_mix = l * mu[i] + (1 - l) * pool[0][j], l * sigma[i] + (1 - l) * pool[1][j]
        hand = sigma_mix.view(3, 1, 1) * (x[i] - mu[i].view(3, 1, 1)) / sigma[i].view(3, 1, 1) + mu_mix.view(3, 1, 1)
        torch.testing.assert_close(view[i], hand, rtol=1e-12, atol=1e-12)
    got_mu, _ = _stats_by_hand(view[:1], unbiased=False)
    torch.testing.assert_close(got_mu[0], pool[0][2], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(view[1], x[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reference", [False, True])
def test_the_loss_is_ce_on_every_view_plus_supcon_plus_js_by_hand(reference):
    """A full forward pass of the float64 model: x, two views restyled with fixed draws and perturbed by a fixed
    stand-in (a horizontal flip); the loss by hand from the model's representations and logits."""
    hp = {"reference_code": reference, "lambda1": 0.7, "lambda2": 0.3, "temperature": 0.5}
    algo, model = make_model("fedccrl", hp)
    model.double().train()
    data = _data(n=8)
    x, y = data.transform(data.images, train=False), data.labels
    pool = {MU: torch.randn(5, 3, dtype=torch.float64), SIGMA: torch.rand(5, 3, dtype=torch.float64) + 0.5}
    draws = iter([(torch.tensor([0, 1, 2, 3, 4, 0, 1, 2]), 0.25), (torch.tensor([4, 4, 3, 3, 2, 2, 1, 1]), 0.75)])
    used = []

    def rows(pool_size, count):
        used.append(next(draws))
        return used[-1][0]

    class Flip:
        norm = Normalization(TRANSFORM.mean, TRANSFORM.std)

        def __call__(self, v):
            return v.flip(3)

    ctx = _ctx(data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fedccrl, "pool_indices", rows)
        mp.setattr(algo.mix, "sample_mix_weights",
                   lambda b, like: torch.full((b, 1, 1, 1), used[-1][1], dtype=like.dtype))
        mp.setattr(algo, "_augmentation", lambda transform: Flip())
        torch.manual_seed(0)
        loss = algo.training_loss(ctx, model, x, y, pool)
    mu, sigma = _stats_by_hand(x, unbiased=reference)
    views = []
    for index, lam in used:
        mu_mix = lam * mu + (1 - lam) * pool[MU][index]
        sigma_mix = lam * sigma + (1 - lam) * pool[SIGMA][index]
        s = (slice(None), slice(None), None, None)
        v = sigma_mix[s] * (x - mu[s]) / sigma[s] + mu_mix[s]
        if reference:
            v = quantize(v, Flip.norm)
        v = v.flip(3)
        views.append(quantize(v, Flip.norm, slack=1e-3) if reference else v)
    with torch.no_grad():
        f0 = model.features(x)
        fv = [model.features(v) for v in views]
        logits = [model.head(f) for f in (f0, *fv)]
    ce = sum(float(F.cross_entropy(v, y)) for v in logits)
    supcon = sum(_supcon_by_hand(f, f0, y, 0.5, include_self=reference) for f in fv) / 2
    js = _js_by_hand(logits)
    assert float(loss.detach()) == pytest.approx(ce + 0.7 * supcon + 0.3 * js, rel=1e-10)
    logged = ctx.logged_metrics()
    assert logged["fedccrl_supcon"] == pytest.approx(supcon, rel=1e-6)
    assert logged["fedccrl_js"] == pytest.approx(js, rel=1e-6)
    assert logged["fedccrl_ce_views"] == pytest.approx(ce - float(F.cross_entropy(logits[0], y)), rel=1e-6)
    assert logged["fedccrl_transferred"] == 1.0 and logged["fedccrl_pool"] == 5


def test_supcon_known_answer_and_the_codes_self_positive():
    """Two classes, unit vectors at right angles, tau 1: every anchor sees its counterpart (cos 1) and two at cos 0,
    L = log(2 + e) - 1; with itself among its positives (the code) the mean positive is still 1 here, and with the
    views turned by 60 degrees it is (1 + cos 60) / 2 against cos 60."""
    e0, e1 = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    originals, labels = torch.cat([e0, e1]), torch.tensor([0, 1])
    expected = math.log(2 + math.e) - 1
    assert float(supervised_contrastive(originals, originals, labels, 1.0)) == pytest.approx(expected, rel=1e-6)
    c, s = math.cos(math.pi / 3), math.sin(math.pi / 3)
    views = torch.tensor([[c, s], [-s, c]])  # each original turned by 60 degrees
    for include_self in (False, True):
        hand = _supcon_by_hand(views.double(), originals.double(), labels, 1.0, include_self)
        got = supervised_contrastive(views, originals, labels, 1.0, include_self=include_self)
        assert float(got) == pytest.approx(hand, rel=1e-6)
    assert _supcon_by_hand(views, originals, labels, 1.0, True) < _supcon_by_hand(views, originals, labels, 1.0, False)


def test_quantize_truncates_to_whole_8_bit_levels():
    norm = Normalization((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    pixels = torch.tensor([0.0, 0.5 / 255, 1.99 / 255, 0.5, 1.2, -0.1]).view(1, 1, 2, 3).expand(1, 3, 2, 3)
    out = norm.to_pixels(quantize(norm.from_pixels(pixels), norm))
    torch.testing.assert_close(out[0, 0].flatten() * 255, torch.tensor([0.0, 0.0, 1.0, 127.0, 255.0, 0.0]),
                               rtol=0, atol=1e-4)


def test_refusals_name_the_fix():
    with pytest.raises(ConfigError, match="at least 2 clients"):
        METHODS.get("fedccrl")({}, num_classes=4, num_clients=1)
    with pytest.raises(ConfigError, match="augmix has no option"):
        METHODS.get("fedccrl")({"perturb_args": "colour=3"}, num_classes=4, num_clients=3)


def test_the_audit_surface_releases_what_the_query_sends(tiny_config):
    from fedstyle.audit.run import SURFACES, _normalizer
    from fedstyle.experiments.build import build_experiment

    exp = build_experiment(tiny_config.updated(method="fedccrl", clients=3, partition="per_domain"), progress=False)
    surface = SURFACES.get("fedccrl")(exp, _normalizer(exp))[0]
    data = exp.simulator.clients[1]
    ctx = ClientContext(client_id=1, data=data, state={}, train=SETTINGS.train_settings(0), round=0, num_clients=3,
                        device=CPU, seed=0, phase="query")
    sent = exp.algorithm.round_query(ctx, exp.model)
    chosen = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[: len(sent[MU])].sort().values
    released = surface.release(data.images[chosen])
    torch.testing.assert_close(released, torch.cat([sent[MU], sent[SIGMA]], 1).double(), rtol=1e-5, atol=1e-6)
    assert surface.per_image and surface.set_size(len(data)) == len(sent[MU])
    torch.testing.assert_close(surface.set_mean(released), surface.image_vectors(data.images[chosen]).mean(0))


def _config(tiny_config, **changes):
    return tiny_config.updated(**{"method": "fedccrl", "partition": "per_domain", "clients": 6, "clients_per_round": 3,
                                  **changes})


def test_fedccrl_logs_its_terms_and_resumes(tiny_config, tmp_path, monkeypatch):
    config = _config(tiny_config, rounds=3)
    full = run_experiment(config, tmp_path / "full", quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train_metrics" in r]
    names = {"fedccrl_ce", "fedccrl_ce_views", "fedccrl_supcon", "fedccrl_js", "fedccrl_transferred", "fedccrl_pool",
             "fedccrl_query_seconds", "fedccrl_transfer_seconds", "fedccrl_perturb_seconds"}
    assert rows and all(names <= set(r["train_metrics"]) for r in rows)
    assert rows[0]["train_metrics"]["fedccrl_transferred"] > 0  # every sampled client has others' rows from round 1
    resumed = interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=2)
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}
    assert evaluations(tmp_path / "cut") == evaluations(tmp_path / "full")


def test_under_flower_equals_the_simulator(tiny_config, tmp_path):
    """The statistics query, the server's pool and the restyled training under Flower's apps (tests/flower_grid.py): the
    same metrics, bytes and weights as in process, bitwise."""
    pytest.importorskip("flwr")
    from safetensors.torch import load_file

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as a site trains (one thread per ClientApp)
    try:
        config = _config(tiny_config, rounds=2, lr_schedule="constant")
        run_experiment(config, tmp_path / "sim", quiet=True)
        run_under_flower(config, tmp_path / "flower")
    finally:
        torch.set_num_threads(before)
    sim_lines = evaluations(tmp_path / "sim")
    assert evaluations(tmp_path / "flower") == sim_lines
    assert all("fedccrl_supcon" in m.get("train_metrics", {}) for m in sim_lines)
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "flower" / "checkpoint.safetensors"))
    shared = {k: v for k, v in a.items() if k.startswith(("global/", "server/"))}
    assert any(k.startswith("server/fedccrl/") for k in shared)
    assert shared and all(torch.equal(v, b[k]) for k, v in shared.items())
