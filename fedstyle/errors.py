"""User-facing errors: the CLI prints these as one clear message (no traceback)."""


class FedstyleError(Exception):
    """A problem the user can fix; the message says what is wrong and how to fix it."""


class ConfigError(FedstyleError, ValueError):
    """An invalid option, hyperparameter or combination of options."""


class DataError(FedstyleError):
    """A dataset that is missing, malformed or inconsistent."""


class NonFiniteLossError(FedstyleError):
    """Training diverged: the loss became NaN or infinite (the message names the learning rate to lower)."""


class UnknownNameError(ConfigError, KeyError):
    """A name that is not in a registry (the message lists the valid names)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


def brief(items, limit: int = 8) -> str:
    """A list for an error message: all of it when short, else the first few and the count."""
    items = list(items)
    if len(items) <= limit:
        return "[" + ", ".join(map(str, items)) + "]"
    return "[" + ", ".join(map(str, items[:limit])) + f", ... ({len(items)} in all)]"
