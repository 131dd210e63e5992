"""Runtimes above the experiments layer: Flower's simulation engine and real Flower deployments.

Importing this package registers its backends with :mod:`fedstyle.experiments.backends`
(``flower-sim``); Flower itself is imported only when a Flower runtime runs, so fedstyle works
without ``flwr`` and a missing Flower or Ray gives the install command.
"""

from __future__ import annotations

from fedstyle.experiments.backends import Backend, register_backend


def _train_on_flower_sim(experiment, out, *, quiet, checkpoint):
    from fedstyle.runtimes.flower.simulation import train_on_flower_sim  # needs fedstyle[flower-sim]

    return train_on_flower_sim(experiment, out, quiet=quiet, checkpoint=checkpoint)


def _check_flower_sim() -> None:
    from fedstyle.runtimes.flower import require_ray

    require_ray()


register_backend(Backend("flower-sim", _train_on_flower_sim, _check_flower_sim, star_only=True,
                         help="Flower's simulation engine on Ray (pip install 'fedstyle[flower-sim]')"))
