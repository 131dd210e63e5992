"""What a validity test sees of the canary threshold chosen on the counting half (mutation N4b, issue 50): over
many audits of two Gaussian worlds N(mu, 1) / N(0, 1) (one statistic), how often the bound exceeds the pair's true
eps at delta = 0.05, with the threshold chosen as fedstyle does (on the selection half) and on the counting half.
A valid 95 % bound may exceed it in 5 % of the audits.

    python benchmarks/canary_threshold_bias.py
"""

from __future__ import annotations

import types

import numpy as np

import fedstyle.audit.canary as canary
from fedstyle.style.privacy import gaussian_epsilon

SETTINGS = [(0.2, 400), (0.3, 200), (0.4, 100)]  # (mu, releases per world)
AUDITS, DELTA = 300, 0.05


def mutated_bound():
    """epsilon_lower_bound with its threshold chosen and its rates read on the counting half (N4b)."""
    source = open(canary.__file__).read()
    start = source.index("    thresholds = np.unique(np.concatenate([pick_a")
    end = source.index("    chosen = float(", start)
    chosen_on_counts = source[start:end].replace("pick_a", "count_a").replace("pick_b", "count_b")
    module = types.ModuleType("canary_n4b")
    exec(compile(source[:start] + chosen_on_counts + source[end:], "canary_n4b", "exec"), module.__dict__)
    return module.epsilon_lower_bound


def main() -> None:
    bounds = {"fedstyle": canary.epsilon_lower_bound, "N4b": mutated_bound()}
    for mu, trials in SETTINGS:
        true = gaussian_epsilon(1 / mu, DELTA)  # the Gaussian pair's eps at DELTA, reached by a threshold test
        g = np.random.default_rng(0)
        exceeded = dict.fromkeys(bounds, 0)
        for k in range(AUDITS):
            a, b = g.normal(mu, 1, trials), g.normal(0, 1, trials)
            for name, bound in bounds.items():
                exceeded[name] += bound(a, b, DELTA, seed=k)["epsilon_lb"] > true
        print(f"mu {mu}, {trials} per world, true eps {true:.3f}: bound > true eps in "
              + ", ".join(f"{n} {c} of {AUDITS}" for n, c in exceeded.items()))


if __name__ == "__main__":
    main()
