"""Run fedstyle's star-topology algorithms on Flower (``pip install 'fedstyle[flower]'``).

Nothing here is imported by fedstyle unless a Flower runtime is asked for (``fedstyle deploy``,
``fedstyle run --backend flower-sim``), so fedstyle works without ``flwr`` installed.

- :mod:`.records`: payloads and weights <-> Flower array / config / metric records (no pickle);
  :mod:`.received`: a received message's records checked and read onto a device (ServerApp and sites);
- :mod:`.clientapp`: the ClientApp (thin: identify without torch) and :mod:`.site`, what a site does
  with a message — the simulator's client procedures, per-client state in the site's state folder
  (:mod:`fedstyle.runtimes.site_state`);
- :mod:`.serverapp`: the ServerApp — the simulator's server side over Flower messages, the same
  run directory (config.json, metrics.jsonl, checkpoint, summary.json, done);
- :mod:`.simulation`: ``--backend flower-sim`` (Flower's simulation engine, Ray);
- :mod:`.deployment`: SuperLink / SuperNode processes (``fedstyle deploy``), supervised by
  :mod:`.processes` (started in their own sessions, stopped together with everything they started);
- :mod:`.certs`: a CA, a server certificate and SuperNode keys for TLS and node authentication.
"""

from __future__ import annotations

from fedstyle.errors import ConfigError

#: the Flower release fedstyle's bridge is written and tested against
FLOWER_VERSION = "1.41.0"
INSTALL_HINT = "pip install -c constraints.txt 'fedstyle[flower]'"


def require_flower(feature: str = "the Flower runtime", hint: str = INSTALL_HINT) -> None:
    """Fail with the install command when ``flwr`` is missing (or not the pinned release)."""
    try:
        import flwr
    except ImportError:
        raise ConfigError(f"{feature} needs Flower; install it with: {hint}") from None
    if flwr.__version__ != FLOWER_VERSION:
        raise ConfigError(f"{feature} is written for flwr=={FLOWER_VERSION}, found flwr {flwr.__version__}; "
                          f"install the pinned release with: {hint}")


def require_ray() -> None:
    """``--backend flower-sim`` runs on Flower's Ray simulation engine."""
    hint = "pip install -c constraints.txt 'fedstyle[flower-sim]'"
    require_flower("--backend flower-sim", hint)
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ConfigError(f"--backend flower-sim runs on Flower's simulation engine, which needs Ray; install it with: {hint}")


#: Flower's log lines that are noise for a fedstyle user: fedstyle calls the simulation engine's Python
#: entry point on purpose (it runs the ServerApp in this process), and Ray's actors say they are being
#: terminated every time a simulation ends normally
FLOWER_NOISE = ("The `run_simulation` function is deprecated", "Manually terminating")


class FlowerNoiseFilter:
    """A logging filter for the ``flwr`` logger that drops :data:`FLOWER_NOISE` and nothing else."""

    def filter(self, record) -> bool:
        message = record.getMessage()
        return not any(text in message for text in FLOWER_NOISE)


def quiet_flower_noise() -> None:
    """Install :class:`FlowerNoiseFilter` on the ``flwr`` logger and its handlers, once per process."""
    import logging

    logger = logging.getLogger("flwr")
    for target in (logger, *logger.handlers):
        if not any(isinstance(f, FlowerNoiseFilter) for f in target.filters):
            target.addFilter(FlowerNoiseFilter())
