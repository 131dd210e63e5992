"""FedOMG (issue 38): the server step by hand on two clients, against an independent solver on random updates and
through a real simulated round, its reference_code mode, and ``server_opt=omg`` composed with FedAvg, CCST and
StableFDG (kappa = 0 is the method itself; otherwise the step sits on the method's own aggregate).

The method x topology matrix and the learning check run ``fedomg`` end to end (it is registered).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.base import weighted_average
from fedstyle.algorithms.context import ClientUpdate, ServerContext
from fedstyle.algorithms.fedomg import OMG, gram, solve_dual
from fedstyle.algorithms.server_opt import SERVER_OPT_CHOICES, SERVER_OPTS
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import run_experiment
from fedstyle.federation import star


def _round(deltas, sizes, base=None, buffer=None):
    """A server at w^r = ``base`` (zeros) and the clients' updates w_i = w^r + Delta_i; BatchNorm-like buffer too."""
    base = torch.zeros(len(deltas[0]), dtype=torch.float64) if base is None else base
    weights = {"w": base, "bn.running_mean": torch.zeros(2, dtype=torch.float64)}
    server = ServerContext(weights=weights, state={}, round=0, num_clients=len(deltas), seed=0)
    updates = [ClientUpdate(i, {"w": base + torch.as_tensor(d, dtype=torch.float64),
                                "bn.running_mean": torch.full((2,), float(i + 1), dtype=torch.float64)}, n, 0.0)
               for i, (d, n) in enumerate(zip(deltas, sizes))]
    return server, updates


def test_server_opt_choices_are_the_registered_optimisers():
    assert SERVER_OPT_CHOICES == ("none", *SERVER_OPTS.names())


def test_two_clients_by_hand_the_worse_aligned_client_gets_the_step():
    """Delta_1 = (2, 0), Delta_2 = (0, 1), equal sizes: g_FL = (1, .5), ||g_FL|| = sqrt(1.25). The dual
    f(t) = 2t + .5(1 - t) + kappa sqrt(1.25) sqrt(4t^2 + (1 - t)^2) over Gamma = (t, 1 - t) has
    f'(0) = 1.5 - kappa sqrt(1.25) > 0 for kappa = .5, so Gamma* = (0, 1), G Gamma* = Delta_2 and
    d = g_FL + kappa sqrt(1.25) (0, 1) = (1, .5 + .5 sqrt(1.25))."""
    server, updates = _round([(2.0, 0.0), (0.0, 1.0)], [5, 5])
    aggregated = weighted_average(updates)
    out = OMG({"kappa": "0.5"}).step(server, updates, aggregated, ["w"], uniform=False)
    d = torch.tensor([1.0, 0.5 + 0.5 * math.sqrt(1.25)], dtype=torch.float64)
    torch.testing.assert_close(out["w"], d, rtol=0, atol=1e-9)
    torch.testing.assert_close(out["bn.running_mean"], aggregated["bn.running_mean"])  # the method's buffers
    # FedAvg's direction gives client 2 cos = .5 / sqrt(1.25); OMG's raises the least cosine
    m = server.metrics
    assert m["omg_min_cos_method"] == pytest.approx(0.5 / math.sqrt(1.25))
    assert m["omg_min_cos"] == pytest.approx(min(2.0 / (2 * d.norm().item()), d[1].item() / d.norm().item()))
    assert m["omg_min_cos"] > m["omg_min_cos_method"]
    assert m["omg_step_ratio"] == pytest.approx(d.norm().item() / math.sqrt(1.25))
    assert m["omg_gamma_max"] == pytest.approx(1.0)
    half = OMG({"kappa": "0.5", "lr": "0.5", "rescale": "true"}).step(server, updates, aggregated, ["w"], False)
    torch.testing.assert_close(half["w"], 0.5 * d / 1.25, rtol=0, atol=1e-9)  # eta and 1 / (1 + kappa^2)


def _scipy_direction(deltas: np.ndarray, p: np.ndarray, kappa: float) -> np.ndarray:
    """The dual by SciPy's SLSQP on the simplex, on the raw vectors (an independent solver), and d."""
    g_fl = p @ deltas
    radius = kappa * np.linalg.norm(g_fl)

    def f(gamma):
        return gamma @ (deltas @ g_fl) + radius * np.linalg.norm(gamma @ deltas)

    S = len(deltas)
    best = None
    for start in [np.full(S, 1.0 / S), *np.eye(S) * 0.9 + 0.1 / S]:
        res = minimize(f, start, method="SLSQP", bounds=[(0, 1)] * S, tol=1e-14, options={"maxiter": 1000},
                       constraints=[{"type": "eq", "fun": lambda g: g.sum() - 1}])
        best = res if best is None or res.fun < best.fun else best
    g_gamma = best.x @ deltas
    return g_fl + radius * g_gamma / np.linalg.norm(g_gamma)


@pytest.mark.parametrize("seed,S,kappa", [(0, 3, 0.5), (1, 4, 0.3), (2, 5, 1.0), (3, 2, 0.8)])
def test_random_updates_match_an_independent_solver(seed, S, kappa):
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=40)
    deltas = shared + 1.5 * rng.normal(size=(S, 40))  # partly aligned, partly conflicting clients
    sizes = rng.integers(5, 50, size=S)
    server, updates = _round(list(deltas), sizes.tolist())
    out = OMG({"kappa": str(kappa)}).step(server, updates, weighted_average(updates), ["w"], uniform=False)
    expected = _scipy_direction(deltas, sizes / sizes.sum(), kappa)
    np.testing.assert_allclose(out["w"].numpy(), expected, rtol=0, atol=1e-6 * np.abs(expected).max())
    # the optimum of max_d min_i <Delta_i, d> within the ball: d lies on its boundary, ||d - g_FL|| = kappa ||g_FL||
    g_fl = weighted_average(updates)["w"].numpy()  # FedAvg's aggregate (summed in float32)
    assert np.linalg.norm(out["w"].numpy() - g_fl) == pytest.approx(kappa * np.linalg.norm(g_fl), rel=1e-12)


def test_the_gram_pass_over_several_keys_and_blocks_equals_the_flat_vectors(monkeypatch):
    from fedstyle.algorithms import fedomg

    monkeypatch.setattr(fedomg, "_CHUNK", 5)  # blocks of 5 elements: every key is cut
    g = torch.Generator().manual_seed(0)
    base = {"a": torch.randn(3, 4, generator=g), "b": torch.randn(7, generator=g)}
    clients = [{k: v + torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(3)]
    agg = {k: sum(c[k] for c in clients) / 3 for k in base}
    M, b, c = gram(base, clients, agg, ["a", "b"])
    flat = torch.stack([torch.cat([(w[k] - base[k]).reshape(-1) for k in "ab"]) for w in clients]).double()
    g_fl = torch.cat([(agg[k] - base[k]).reshape(-1) for k in "ab"]).double()
    torch.testing.assert_close(M, flat @ flat.T)
    torch.testing.assert_close(b, flat @ g_fl)
    torch.testing.assert_close(c, g_fl @ g_fl)


def test_solver_edge_cases():
    one = solve_dual(torch.tensor([[4.0]], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64), 1.0, 50)
    assert one.tolist() == [1.0]
    zero = solve_dual(torch.zeros(3, 3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), 0.0, 50)
    torch.testing.assert_close(zero, torch.full((3,), 1 / 3, dtype=torch.float64))


def test_kappa_zero_is_the_methods_aggregation_and_no_movement_is_no_step():
    server, updates = _round([(1.0, -2.0), (3.0, 0.5), (0.0, 1.0)], [1, 2, 3])
    aggregated = weighted_average(updates)
    out = OMG({"kappa": "0"}).step(server, updates, aggregated, ["w"], uniform=False)
    torch.testing.assert_close(out["w"], aggregated["w"], rtol=0, atol=1e-12)
    still, same = _round([(0.0, 0.0), (0.0, 0.0)], [1, 1])
    out = OMG({}).step(still, same, weighted_average(same), ["w"], False)
    assert torch.equal(out["w"], torch.zeros(2, dtype=torch.float64))


def test_reference_code_on_one_client_by_hand():
    """One client (the code's num_tasks = 1): Gamma = 1, p = 1, Gram m = ||Delta||^2. fed_merge.py's
    numbers: scale = sqrt(m + 1e-4), GG = Gg = gg = m / scale^2, c = sqrt(gg + 1e-4) kappa,
    lambda = c / (sqrt(GG + 1e-4) + 1e-4), d = (1 + lambda) Delta / (1 + kappa^2), w <- w^r + .5 d, and every
    buffer stays at w^r."""
    server, updates = _round([(3.0, 4.0)], [7])
    out = OMG({"reference_code": "true", "kappa": "0.5"}).step(server, updates, weighted_average(updates), ["w"],
                                                               False)
    m = 25.0
    gg = m / (math.sqrt(m + 1e-4) ** 2)
    lam = math.sqrt(gg + 1e-4) * 0.5 / (math.sqrt(gg + 1e-4) + 1e-4)
    expected = 0.5 * (1 + lam) / 1.25 * torch.tensor([3.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(out["w"], expected, rtol=0, atol=1e-12)
    assert torch.equal(out["bn.running_mean"], server.weights["bn.running_mean"])  # never aggregated


def test_reference_code_weighs_the_columns_and_takes_a_step_of_one_over_s():
    """Two orthogonal clients with equal weights p = 1/2: the code's g_FL is the mean of the columns p_i Delta_i,
    a quarter of Delta_1 + Delta_2 here, and by symmetry Gamma = (1/2, 1/2): d = (1/2)(1/2 + lambda/2) sum Delta_i
    / (1 + kappa^2) with lambda = c / (||G Gamma|| + 1e-4) on the normalised Gram."""
    server, updates = _round([(2.0, 0.0), (0.0, 2.0)], [1, 1])
    opt = OMG({"reference_code": "true", "kappa": "0.5", "lr": "1"})
    out = opt.step(server, updates, weighted_average(updates), ["w"], uniform=False)
    # columns (1, 0), (0, 1): scale = sqrt(1 + 1e-4), GG = I / scale^2, gg = 1 / (2 scale^2)
    s2 = 1 + 1e-4
    c = math.sqrt(0.5 / s2 + 1e-4) * 0.5
    lam = c / (math.sqrt(0.5 / s2 + 1e-4) + 1e-4)
    coef = 0.5 * (0.5 + lam * 0.5) / 1.25
    torch.testing.assert_close(out["w"], torch.tensor([2 * coef, 2 * coef], dtype=torch.float64), rtol=0, atol=1e-12)


def test_bad_options_are_refused_in_one_line():
    for hp, match in [({"server_opt": "omg", "server_opt_args": "kapa=1"}, "unknown hyperparameter 'kapa'"),
                      ({"server_opt": "omg", "server_opt_args": "kappa=-1"}, "below the minimum"),
                      ({"server_opt": "omg", "server_opt_args": "kappa"}, "NAME=VALUE"),
                      ({"server_opt_args": "kappa=1"}, "server_opt is none"),
                      ({"server_opt": "adam"}, "not one of none, omg")]:
        with pytest.raises(ConfigError, match=match):
            METHODS.get("fedavg")(hp, num_classes=2, num_clients=2)


def test_labels_name_the_server_step():
    assert METHODS.get("fedomg").display_name(METHODS.get("fedomg").resolve({})) == "FedOMG"
    fedavg = METHODS.get("fedavg")
    assert fedavg.display_name(fedavg.resolve({"server_opt": "omg"})) == "FedAvg + OMG"
    fedomg = METHODS.get("fedomg")
    assert fedomg.display_name(fedomg.resolve({"server_opt": "none"})) == "FedOMG + no server step"


def test_peer_to_peer_has_no_server_to_step(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="peer-to-peer run has no server"):
        run_experiment(tiny_config.updated(method="dsgd", topology="ring", partition="per_domain", clients=6,
                                           hparams={"server_opt": "omg"}), tmp_path / "p2p", quiet=True)
    assert not (tmp_path / "p2p").exists()


def _record_rounds(monkeypatch) -> list[dict]:
    """Wrap the star driver's server step: per round, w^r, the updates, the method's aggregate and the result."""
    seen: list[dict] = []
    real = star.server_update

    def recording(algo, server, updates, keys):
        before = {k: v.clone() for k, v in server.weights.items()}
        out = real(algo, server, updates, keys)
        seen.append({"before": before, "updates": updates, "keys": list(keys), "algo": algo, "out": out,
                     "aggregate": algo.aggregate(ServerContext(before, server.state, server.round, server.num_clients,
                                                               server.seed, server.rounds), updates)})
        return out

    monkeypatch.setattr(star, "server_update", recording)
    return seen


COMPOSED = [("fedavg", {}), ("ccst", {"k": 1}), ("stablefdg", {"style_images": 4})]


@pytest.mark.parametrize("method,hp", COMPOSED, ids=[m for m, _ in COMPOSED])
def test_omg_composes_with_the_methods_own_aggregation(tiny_config, tmp_path, monkeypatch, method, hp):
    """kappa = 0 reproduces the method without the server step; kappa = .5 applies d = g_FL + kappa ||g_FL||
    G Gamma / ||G Gamma|| to the method's own aggregate (checked against SciPy's solve of the dual)."""
    config = tiny_config.updated(method=method, rounds=1, partition="per_domain", clients=3, hparams=hp)
    seen = _record_rounds(monkeypatch)
    plain = run_experiment(config, tmp_path / "plain", quiet=True)
    zero = run_experiment(config.updated(hparams={**hp, "server_opt": "omg", "server_opt_args": "kappa=0"}),
                          tmp_path / "zero", quiet=True)
    for key in seen[0]["out"]:
        torch.testing.assert_close(seen[1]["out"][key], seen[0]["out"][key], rtol=0, atol=1e-6)
    assert zero["targets"] == plain["targets"]
    run_experiment(config.updated(hparams={**hp, "server_opt": "omg"}), tmp_path / "omg", quiet=True)
    step = seen[2]
    keys = [k for k in step["keys"] if step["before"][k].is_floating_point()]
    before, agg = step["before"], step["aggregate"]
    flat = lambda w: torch.cat([(w[k].double() - before[k].double()).reshape(-1) for k in keys]).numpy()  # noqa: E731
    deltas = np.stack([flat(u.weights) for u in step["updates"]])
    g_fl = flat(agg)
    sizes = np.array([u.num_samples for u in step["updates"]], dtype=float)
    if method == "fedavg":
        np.testing.assert_allclose(g_fl, (sizes / sizes.sum()) @ deltas, atol=1e-6)
    expected = _scipy_direction_from(deltas, g_fl, 0.5)
    np.testing.assert_allclose(flat(step["out"]), expected, rtol=0, atol=1e-4 * np.abs(expected).max())
    for key in step["out"]:
        if key not in keys:  # buffers and counters: the method's aggregate
            assert torch.equal(step["out"][key], agg[key])
    assert METHODS.get(method).display_name(step["algo"].hp).endswith(" + OMG")


def _scipy_direction_from(deltas: np.ndarray, g_fl: np.ndarray, kappa: float) -> np.ndarray:
    radius = kappa * np.linalg.norm(g_fl)
    S = len(deltas)
    res = minimize(lambda g: g @ (deltas @ g_fl) + radius * np.linalg.norm(g @ deltas), np.full(S, 1.0 / S),
                   method="SLSQP", bounds=[(0, 1)] * S, tol=1e-14, options={"maxiter": 1000},
                   constraints=[{"type": "eq", "fun": lambda g: g.sum() - 1}])
    g_gamma = res.x @ deltas
    return g_fl + radius * g_gamma / np.linalg.norm(g_gamma)


def test_fedomg_logs_its_server_step_and_resumes(tiny_config, tmp_path, monkeypatch):
    import json

    from run_records import evaluations
    from tiny import interrupt_and_resume

    config = tiny_config.updated(method="fedomg", rounds=3, partition="per_domain", clients=6, clients_per_round=3)
    full = run_experiment(config, tmp_path / "full", quiet=True)
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    logged = [r["train_metrics"] for r in rows if "train_metrics" in r]
    assert logged and all({"omg_step_ratio", "omg_min_cos", "server_opt_seconds"} <= set(m) for m in logged)
    resumed = interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=2)
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}
    assert evaluations(tmp_path / "cut") == evaluations(tmp_path / "full")
