"""Sweep files: a grid of runs written as TOML, checked whole before anything runs.

A sweep file::

    description = "FedAvg against local MixStyle over three heterogeneity levels"
    seeds = [0, 1, 2]                 # crossed: one run per seed
    targets = "each"                  # crossed: every domain of the dataset held out in turn
    lam = [0.0, 0.1, 1.0]             # any run setting given as a list is crossed
    hparams.style_p = [0.3, 0.5]      # so is a hyperparameter (every variant's method must declare it)

    [base]                            # a run config, the keys of `fedstyle run --config`
    dataset = "digits4"
    partition = "lambda"
    rounds = 8

    [[variant]]                       # rows: a name (its folder), a method, its hparams, any setting
    name = "fedavg"
    method = "fedavg"

    [[variant]]
    name = "mixstyle"
    method = "mixstyle"
    hparams = { style_stages = "layer1,layer2" }
    local_steps = [10, 20]            # a list inside a variant is crossed for that variant only

Crossing settings that belong together (a test domain with its validation domain, a topology with
its number of devices) is a *bundle* axis: a list of tables under any name that is not a setting::

    split = [{ name = "s-p", targets = ["sketch"], val_domain = "photo" },
             { name = "p-s", targets = ["photo"], val_domain = "sketch" }]

Layout: ``OUT/<variant>/<crossed keys>/seed<k>/<target>``. ``<crossed keys>`` is one folder naming
every crossed key of the run other than seeds and targets, in file order (the grid's, then the
variant's), as ``key=value`` joined by commas: ``lam=0.1,style_p=0.3``; a bundle appears as
``split=s-p`` (its ``name``, else its values joined by ``-``); a hyperparameter whose name is also
a run setting's appears as ``hp.NAME``. The folder is left out when nothing is crossed. ``<target>``
is the held-out domain (several joined by ``+``; ``others`` when the protocol picks them, as
single_source does).

Reports: the crossed run settings and bundles of the grid level split the runs into report groups
(one table each, e.g. per dataset or per lambda); crossed hyperparameters and everything a variant
crosses become rows of the table (``report_by = [...]`` names the keys that split instead). Runs on
different datasets are always in different groups.

Preset files (``fedstyle reproduce``) add ``[scales.<name>]`` tables that override the grid per
scale (``seeds``, ``targets``, any crossed key, ``[scales.X.base]`` merged into ``[base]``,
``variants = [...]`` a subset of the rows, ``description``), a ``[paper]`` table with the paper's
numbers and ``claims`` (see :mod:`fedstyle.experiments.paper`).

A variant's own settings win over a bundle's (``topology = "star"`` for a server baseline in a grid
of peer-to-peer networks); a variant may not fix a key the grid crosses as a list.

Hyperparameters in ``[base.hparams]`` apply to every variant whose method declares them (the
smoke scale of a preset can switch every style-transfer method to the ``fft`` backend); one that
no variant's method declares is an error.

The package, in the order a sweep file goes through it: :mod:`~fedstyle.experiments.grid.spec` (what a
parsed grid is), :mod:`~fedstyle.experiments.grid.parse` (a sweep file into a :class:`Grid`),
:mod:`~fedstyle.experiments.grid.plan` (a :class:`Grid` into validated runs, a :class:`Plan`).
"""

from fedstyle.experiments.grid.parse import (
    GRID_KEYS,
    RESERVED_NAMES,
    SCALE_KEYS,
    VARIANT_KEYS,
    load_grid,
    parse_grid,
    parse_override,
    read_toml,
    value_label,
)
from fedstyle.experiments.grid.plan import (
    OTHERS,
    RESULT_NEUTRAL,
    Plan,
    PlannedRun,
    group_folder,
    group_title,
    plan_grid,
    run_status,
)
from fedstyle.experiments.grid.spec import Axis, Grid, VariantSpec

__all__ = [
    "GRID_KEYS",
    "OTHERS",
    "RESERVED_NAMES",
    "RESULT_NEUTRAL",
    "SCALE_KEYS",
    "VARIANT_KEYS",
    "Axis",
    "Grid",
    "Plan",
    "PlannedRun",
    "VariantSpec",
    "group_folder",
    "group_title",
    "load_grid",
    "parse_grid",
    "parse_override",
    "plan_grid",
    "read_toml",
    "run_status",
    "value_label",
]
