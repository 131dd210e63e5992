"""The leaderboard (issue 51): every method side by side, on every held-out target, rendered from kept CSVs.

- :mod:`~fedstyle.experiments.leaderboard.tables`: the three tables as sweep files (benchmarks/leaderboard/),
  their rows completed from the method registry;
- :mod:`~fedstyle.experiments.leaderboard.run`: running them with the sweep machinery and merging each finished
  run into benchmarks/per_seed/leaderboard-*.csv;
- :mod:`~fedstyle.experiments.leaderboard.cost`: the CPU-hours estimate from measured seconds.

Nothing here imports torch at import time: ``fedstyle leaderboard show`` renders without it.
"""
