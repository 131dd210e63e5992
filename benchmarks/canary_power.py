"""The canary audit's power (issue 50, section 7): how often the bound passes the analytic eps when the noise is f
times smaller than claimed, simulated through fedstyle.audit.canary.canary_power (scores of the receiver's
projection, no training), and the bound the claimed noise gives (what an over-claiming accountant must stay under
to be caught). Defaults: docs/results/privacy.md's CCST per-image setting (canary share 0.74 of 2C, z = 1,
delta = 1e-5, 1000 releases per world); ~20 s.

    python benchmarks/canary_power.py [--share 0.74] [--noise 1] [--delta 1e-5] [--trials 1000] [--repeats 100]
"""

from __future__ import annotations

import argparse

import numpy as np

from fedstyle.audit.canary import canary_power, epsilon_lower_bound
from fedstyle.style.privacy import gaussian_epsilon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--share", type=float, default=0.74)
    parser.add_argument("--noise", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--factors", type=float, nargs="+", default=[1, 2, 3, 4, 5, 6, 8, 10])
    args = parser.parse_args()
    claimed = gaussian_epsilon(args.noise, args.delta)
    power = canary_power(args.share, args.noise, args.delta, args.trials, tuple(args.factors), repeats=args.repeats)
    print(f"share {args.share}, z = {args.noise}, delta = {args.delta:g}, {args.trials} releases per world, "
          f"{args.repeats} audits each; analytic eps {claimed:.2f}")
    for factor, p in power.items():
        print(f"  noise {factor:g}x smaller than claimed: the bound passes the analytic eps in {100 * p:.0f} % "
              "of audits")
    g = np.random.default_rng(0)
    gap = args.share / args.noise
    bounds = [epsilon_lower_bound(g.normal(gap, 1, args.trials), g.normal(0, 1, args.trials), args.delta,
                                  seed=k)["epsilon_lb"] for k in range(args.repeats)]
    print(f"  the claimed noise: bound median {np.median(bounds):.2f}, 5-95 % {np.percentile(bounds, 5):.2f}-"
          f"{np.percentile(bounds, 95):.2f} (an accountant is caught only when it claims less)")


if __name__ == "__main__":
    main()
