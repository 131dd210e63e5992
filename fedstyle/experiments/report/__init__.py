"""Paper-style results from finished run directories: a table of held-out-domain accuracy and curves.

A run directory holds ``config.json``, ``metrics.jsonl`` (one evaluation per line),
``summary.json`` (the selected and last-round target accuracies) and a ``done`` marker written
last. :func:`collect` loads runs, :func:`results_table` aggregates them into one row per method
(``summary["label"]``) and one column per held-out domain, :func:`plot_accuracy` draws target
accuracy per round, and :func:`write_report` writes ``report.md``, ``report.csv``, ``report.tex``
(booktabs, for a paper's column) and the figures, each as PNG and PDF.

Aggregation rules (stated in the table caption and footnotes):

* a cell is the mean ± sample standard deviation (ddof=1) over seeds of the accuracy in percent;
  with a single seed only the mean is shown; ``—`` marks a domain the method never reached;
* leave-one-domain-out sweeps (one target per run) are merged: runs of one label and seed with
  different targets fill the columns of one row; two runs giving the same label, seed and target
  are an error rather than a silent choice;
* ``Avg`` is computed per seed (mean over that seed's domain columns), then mean ± std over seeds.
  If some seed lacks a column, its average covers only the domains it has and the cell is marked
  ``*``; a domain cell with fewer seeds than the row's ``n`` is marked ``*`` too;
* what is compared is said: the settings every run shares are listed under the table; settings
  that differ between rows become columns (with a warning when rows differ in more than the
  method), and runs of one label with different settings become separate rows (``FedProx
  (hp.mu=0.1)``); ``fedstyle run --label NAME`` (and sweep variant names) name a row;
* ``MB/run`` and ``s/run`` are the mean bytes sent (up + down) and wall seconds of a row's runs.

The package, in the order a report is made: :mod:`.runs` reads run directories back,
:mod:`.tabulate` aggregates them into the table, :mod:`.render` writes it out (text, markdown, CSV
and :func:`write_report`) with the figures of :mod:`.plots`. The names other modules use are
imported here, so ``from fedstyle.experiments.report import ...`` covers them.
"""

from fedstyle.experiments.report.plots import plot_accuracy, plot_training
from fedstyle.experiments.report.render import to_csv, to_latex, to_markdown, to_text, write_report
from fedstyle.experiments.report.runs import NOT_SETTINGS, WHICH, RunRecord, collect, load_run
from fedstyle.experiments.report.tabulate import (MISSING, PARTIAL_FOOTNOTE, PARTIAL_MARK, SELECTION_RULES, Cell,
                                                  Row, RowPlan, Table, plan_rows, results_table)

__all__ = ["Cell", "MISSING", "NOT_SETTINGS", "PARTIAL_FOOTNOTE", "PARTIAL_MARK", "Row", "RowPlan", "RunRecord",
           "SELECTION_RULES", "Table", "WHICH", "collect", "load_run", "plan_rows", "plot_accuracy", "plot_training",
           "results_table", "to_csv", "to_latex", "to_markdown", "to_text", "write_report"]
