"""The leaderboard (issue 51): every method side by side, on every held-out target, rendered from kept CSVs.

In the order the work goes through it:

- :mod:`~fedstyle.experiments.leaderboard.tables`: the three tables, plain sweep files in benchmarks/leaderboard/
  whose rows are completed from the method registry, and tables.toml beside them;
- :mod:`~fedstyle.experiments.leaderboard.cost`: the CPU-hours estimate from measured seconds;
- :mod:`~fedstyle.experiments.leaderboard.run`: running them with the sweep machinery, merging each finished run
  into benchmarks/per_seed/leaderboard-*.csv;
- :mod:`~fedstyle.experiments.leaderboard.board`: a table read back from its CSV (cells, averages, the best and
  the rows tied with it by the paired rule, "not learned", missing cells);
- :mod:`~fedstyle.experiments.leaderboard.ranks` and :mod:`~fedstyle.experiments.leaderboard.cdplot`: average
  ranks, the Friedman test, Nemenyi's critical difference and its diagram (Demšar 2006);
- :mod:`~fedstyle.experiments.leaderboard.render`: Markdown, CSV and LaTeX;
- :mod:`~fedstyle.experiments.leaderboard.claims`: the papers' claims at a glance, and
  :mod:`~fedstyle.experiments.leaderboard.results_pages`: each results page's line on them;
- :mod:`~fedstyle.experiments.leaderboard.page`: docs/results/leaderboard.md and the README's table.

Nothing here imports torch at import time; ``fedstyle leaderboard show`` renders without it.
"""
