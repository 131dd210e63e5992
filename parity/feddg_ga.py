"""Parity fixture for FedDG-GA: the aggregation-weight adjustment of the authors' code and of PARDON's fork
(fedstyle's ``reference_code``), over several rounds on fixed generalization gaps.

Two checkouts:

- ``MediaBrain-SJTU/FedDG-GA`` (``--checkout``, pinned ``COMMIT``), the authors' code: ``refine_weight_dict_by_GA``
  and ``weight_clip`` (utils/weight_adjust.py:3-37), called as their PACS scripts call them
  (algorithms/fedavg/train_pacs_GA.py:54,61-62,83): three sites starting at 1/3, rounds i = 0..R (R + 1
  calls), step argument ``d - (i - 1) * d / R`` (that expression is evaluated here, the rest is their
  function). The site results before and after aggregation are seeded numbers (``seeded("official/<run>/
  before")``...), stored with the step of each round and the weights after it. Two runs: ``acc`` (their
  scripts' default metric, d = 0.2, R = 5) and ``loss`` (d = 1.5, R = 5: large steps, so weights are clipped to 0).
- ``judydnguyen/PARDON-FedDG`` (``--pardon``, pinned ``PARDON_COMMIT``): ``FedDGGA.train_federated_model``,
  ``refine_weight_dict_by_GA``, ``weight_clip`` and ``FedAvg.aggregate`` (src/server.py:579-693, 120-135),
  on a server built with its own constructor (``FedDGGA(device, ds_bundle, hparam)``, ``setup_model``,
  ``register_clients``; ``contribution_scores`` initialised as ``FedDGGA.fit`` does, src/server.py:693) and
  run for R = 8 rounds of 6 clients. The clients are stand-ins: ``fit(flr)`` returns the gap of a fixed
  table (``GAPS``: a round 0, a round where every client's weight is clipped to 0, a round whose
  participants all have weight 0, a round with a NaN gap, ordinary rounds) and sets the client's model
  (one Linear(6, 1) weight) to the one-hot vector e_i, so the aggregated global weight is the vector of
  mixing coefficients the server used; the sampled clients come from a fixed schedule (``SAMPLED``, the
  instance's ``sample_clients`` replaced: the draw is not what is compared), ``len(client)`` its size.
  Stored per round: the coefficients (captured from the ``aggregate`` call, float64) and the
  contribution scores after the round.

Import stubs (PARDON's src/server.py, :func:`parity.common.feddg_benchmark_imports`): torchvision, wandb, wilds,
termcolor and its ``src/adain_net.py`` are empty stub modules while it imports, and ``torch.load`` returns an
empty dict during the import (src/server.py:29-30 and src/client.py:34-35 load ``src/models/*.pth``, not in the
repository); none of it is used by the compared functions.

Run: ``.venv/bin/python -m parity.feddg_ga --checkout /tmp/parity/FedDG-GA --pardon /tmp/parity/PARDON-FedDG``.
"""

from __future__ import annotations

import importlib.util
import math
import types
from pathlib import Path

import torch

from parity.common import (feddg_benchmark_imports, generator_name, importable, parse_args, require_checkout, seeded,
                           write_fixture)

REPOSITORY = "MediaBrain-SJTU/FedDG-GA"
COMMIT = "8d03a24a2af2155dc0b8978afacfdb659146bf62"
PARDON_REPOSITORY = "judydnguyen/PARDON-FedDG"
PARDON_COMMIT = "e5df7dd8de43142413885b336e66210104ce9162"

SITES = ("art", "cartoon", "sketch")
#: the official runs: metric -> (d, R)
OFFICIAL = {"acc": (0.2, 5), "loss": (1.5, 5)}

#: PARDON's run: 6 clients, 8 rounds
SIZES = (30, 50, 20, 40, 10, 60)
ROUNDS = 8
SAMPLED = ((0, 1, 2), (0, 1, 2, 3, 4, 5), (0, 1, 2), (1, 3, 5), (1, 3, 4), (1, 2, 5), (0, 2, 4), (3, 4, 5))
NAN = float("nan")
GAPS = (  # per round, for the sampled clients in order
    (1.9, 2.1, 1.7),                        # round 0: aggregated by size, no adjustment
    (-1.0, -0.9, -0.8, -0.7, -0.65, -0.6),  # every weight clipped to 0 (PARDON keeps them all 0)
    (0.5, -0.2, 0.3),
    (0.4, NAN, -0.1),                       # a NaN gap: by size, no adjustment
    (-0.3, -0.5, -0.1),                     # participants all at weight 0: uniform coefficients
    (0.25, -0.05, 0.6),
    (-0.2, 0.15, 0.35),
    (0.05, -0.4, 0.3),
)
SETTINGS = {"sites": list(SITES), "official": {k: list(v) for k, v in OFFICIAL.items()}, "sizes": list(SIZES),
            "rounds": ROUNDS, "sampled": [list(s) for s in SAMPLED],
            "gaps": [[None if math.isnan(g) else g for g in row] for row in GAPS]}


def official_results(metric: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(before, after) site results of the official run ``metric``, each (R + 1, 3) float64."""
    _, rounds = OFFICIAL[metric]
    shape = (rounds + 1, len(SITES))
    if metric == "acc":  # accuracies in (0, 1), the global model a little worse than the local ones
        before = 0.6 + 0.1 * seeded(f"official/{metric}/before", shape).double().tanh()
        after = before - 0.05 + 0.05 * seeded(f"official/{metric}/after", shape).double()
    else:  # losses
        before = 0.8 + 0.2 * seeded(f"official/{metric}/before", shape).double().abs()
        after = before + 0.1 + 0.3 * seeded(f"official/{metric}/after", shape).double()
    return before, after


def run_official(checkout: Path, metric: str) -> dict[str, torch.Tensor]:
    """The authors' weight updates of one run: steps (R + 1,) and weights after each round (R + 1, 3)."""
    path = checkout / "utils" / "weight_adjust.py"
    spec = importlib.util.spec_from_file_location("feddg_ga_weight_adjust", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    d, rounds = OFFICIAL[metric]
    before, after = official_results(metric)
    weight_dict = {site: 1.0 / 3.0 for site in SITES}  # train_pacs_GA.py:54
    step_size_decay = d / rounds  # train_pacs_GA.py:61
    steps, weights = [], []
    for i in range(rounds + 1):  # train_pacs_GA.py:62
        step = d - (i - 1) * step_size_decay  # train_pacs_GA.py:83
        results_before = {s: {metric: float(before[i, j])} for j, s in enumerate(SITES)}
        results_after = {s: {metric: float(after[i, j])} for j, s in enumerate(SITES)}
        weight_dict = module.refine_weight_dict_by_GA(weight_dict, results_before, results_after, step,
                                                      fair_metric=metric)
        steps.append(step)
        weights.append([float(weight_dict[s]) for s in SITES])
    out = {"step": torch.tensor(steps, dtype=torch.float64), "weights": torch.tensor(weights, dtype=torch.float64),
           "before": before, "after": after}
    if not bool(torch.isfinite(out["weights"]).all()):
        raise SystemExit(f"the official {metric} run produced NaN weights: choose other inputs")
    return out


class _Client:
    """A stand-in for PARDON's FedDGGAClient: ``fit`` returns the table's gap and leaves e_i as its model."""

    def __init__(self, index: int, size: int):
        self.index, self.size = index, size

    def __len__(self):
        return self.size

    def setup_model(self, featurizer, classifier):
        self.model = torch.nn.DataParallel(torch.nn.Sequential(featurizer, classifier))

    def update_model(self, state):
        self.model.load_state_dict(state)

    def fit(self, flr=0):
        with torch.no_grad():
            weight = self.model.module[0].weight
            weight.zero_()
            weight[0, self.index] = 1.0
        return GAPS[flr][SAMPLED[flr].index(self.index)]


def run_pardon(checkout: Path) -> dict[str, torch.Tensor]:
    """PARDON's FedDGGA over ``ROUNDS`` rounds: per round the mixing coefficients (scattered to all clients)
    and the contribution scores after it, each (ROUNDS, N) float64."""
    n = len(SIZES)
    with importable(checkout), feddg_benchmark_imports():
        import src.server as server_module

        bundle = types.SimpleNamespace(featurizer=torch.nn.Linear(n, 1, bias=False), classifier=torch.nn.Identity())
        server = server_module.FedDGGA("cpu", bundle, {"num_rounds": ROUNDS, "fraction": 0.5})
        server.setup_model()
        server.register_clients([_Client(i, s) for i, s in enumerate(SIZES)])
        server.contribution_scores = {key: 1 / len(server.clients) for key in range(len(server.clients))}  # fit()
        schedule = iter(SAMPLED)
        server.sample_clients = lambda: list(next(schedule))
        aggregate, captured = server.aggregate, []

        def recording(sampled, coefficients):
            captured.append((list(sampled), [float(c) for c in coefficients]))
            return aggregate(sampled, coefficients)

        server.aggregate = recording
        coefficients = torch.zeros(ROUNDS, n, dtype=torch.float64)
        scores = torch.zeros(ROUNDS, n, dtype=torch.float64)
        aggregated = torch.zeros(ROUNDS, n, dtype=torch.float64)
        for r in range(ROUNDS):
            server.train_federated_model(flr=r)
            sampled, coefs = captured[-1]
            assert sampled == list(SAMPLED[r])
            coefficients[r, sampled] = torch.tensor(coefs, dtype=torch.float64)
            scores[r] = torch.tensor([float(server.contribution_scores[k]) for k in range(n)], dtype=torch.float64)
            aggregated[r] = server.model.module[0].weight.detach().double().reshape(-1)
        # the global model is the coefficient vector: the capture saw what aggregate() used
        torch.testing.assert_close(aggregated, coefficients, rtol=0, atol=1e-6)
    return {"coefficients": coefficients, "scores": scores}


def main(argv: list[str] | None = None) -> Path:
    args = parse_args("feddg_ga", (__doc__ or "").split("\n")[0], REPOSITORY, COMMIT, argv,
                      others={"pardon": (PARDON_REPOSITORY, PARDON_COMMIT)})
    commit = require_checkout(args.checkout, COMMIT, args.allow_unpinned)
    pardon_commit = require_checkout(args.pardon, PARDON_COMMIT, args.allow_unpinned)
    tensors = {}
    for metric in OFFICIAL:
        tensors.update({f"official/{metric}/{k}": v for k, v in run_official(args.checkout, metric).items()})
    tensors.update({f"pardon/{k}": v for k, v in run_pardon(args.pardon).items()})
    settings = dict(SETTINGS, pardon_repository=PARDON_REPOSITORY, pardon_commit=pardon_commit)
    return write_fixture(args.out, tensors, repository=REPOSITORY, commit=commit, generator=generator_name("feddg_ga"),
                         description="FedDG-GA weight adjustment: the authors' refine_weight_dict_by_GA "
                                     "(utils/weight_adjust.py) over two runs, and PARDON's fork's FedDGGA server "
                                     "(src/server.py:579) over 8 rounds of 6 clients",
                         settings=settings)


if __name__ == "__main__":
    main()
