"""Run fedstyle's star-topology algorithms on Flower (``pip install 'fedstyle[flower]'``).

Nothing here is imported by fedstyle unless a Flower runtime is asked for (``fedstyle deploy``,
``fedstyle run --backend flower-sim``), so fedstyle works without ``flwr`` installed.

- :mod:`.records`: payloads and weights <-> Flower array / config / metric records (no pickle);
- :mod:`.clientapp`: the ClientApp (thin: identify without torch) and :mod:`.site`, what a site does
  with a message — the simulator's client procedures, per-client state in the site's state folder
  (:mod:`fedstyle.runtimes.site_state`);
- :mod:`.serverapp`: the ServerApp — the simulator's server side over Flower messages, the same
  run directory (config.json, metrics.jsonl, checkpoint, summary.json, done);
- :mod:`.simulation`: ``--backend flower-sim`` (Flower's simulation engine, Ray);
- :mod:`.deployment`: SuperLink / SuperNode processes (``fedstyle deploy``);
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
