"""Experiment trackers: a run also logged to MLflow or TensorBoard, from where metrics.jsonl is written.

``--tracker mlflow`` / ``--tracker tensorboard`` (repeatable) make the round loop
(:func:`fedstyle.experiments.runner.train_experiment`, the same under every runtime) hand each
row it writes to metrics.jsonl to the trackers as well:

- **params**: the resolved configuration (``hparams.NAME`` for the method's own), once per run;
- **metrics**, step = round: every number of the row — ``train_loss``, ``target_acc/<domain>``
  and ``target_acc/mean`` (likewise ``source_val_acc``, ``heldout_val_acc``), the method's loss
  terms and timings ``train_metrics/<name>``, ``bytes_*``; the setup exchange's numbers as
  ``setup/<name>`` at step 0;
- **artifacts** at the end: config.json, partition.json, summary.json and the run's PNGs
  (MLflow: files; TensorBoard: text and images).

Nothing here needs an account or a server. MLflow logs to ``--mlflow-uri``, else
``$MLFLOW_TRACKING_URI``, else a file store ``./mlruns`` (``mlflow ui --backend-store-uri ./mlruns``
shows it; MLflow 3 keeps file stores in maintenance mode, so fedstyle opts in to them with
``MLFLOW_ALLOW_FILE_STORE`` for the URIs it opens). TensorBoard writes event files into
``--tensorboard-dir``, else ``RUN_DIR/tensorboard`` (``tensorboard --logdir`` on a sweep's folder
finds them all). The tracker's run is recorded in ``RUN_DIR/tracking.json``: ``--resume`` logs on
into the same MLflow run; a tracker added on resume first logs the rounds already done (a finished
run's too). A tracker that has logged stays where it is: ``--resume`` refuses to drop it or move it
(another ``--mlflow-uri`` / ``--tensorboard-dir``), which would leave its run unfinished or split;
``--restart`` closes the old runs and starts new ones (:mod:`fedstyle.experiments.tracking_resume`).

An MLflow server is probed before anything is written (:func:`probe_trackers`, ``PROBE_SECONDS``):
MLflow's own client retries a server that does not answer for minutes (252 s measured).

metrics.jsonl stays the record: a tracker that fails while the run trains is warned about once
and dropped, the training goes on.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterable

from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.io import atomic_write_json
from fedstyle.registry import Registry

TRACKING_FILE = "tracking.json"
TENSORBOARD_DIR = "tensorboard"  # in the run directory, unless --tensorboard-dir says otherwise
#: characters MLflow refuses in a metric name (a folder dataset's domain may hold them)
_METRIC_NAME = re.compile(r"[^A-Za-z0-9_\-. :/]")
#: files of the run directory handed to the trackers at the end (PNGs are added as found)
ARTIFACTS = ("config.json", "partition.json", "summary.json")
#: seconds an MLflow server gets to answer the probe before a run starts or resumes
PROBE_SECONDS = 5.0


class TrackerError(FedstyleError):
    """A tracker could not start (unreachable MLflow server, unwritable log folder)."""


def flatten_numbers(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Every number of a metrics.jsonl row by its path (``target_acc/mnist``), plus the mean of each
    per-domain accuracy table (``target_acc/mean``); strings, lists and booleans are left out."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            out[name] = float(value)
        elif isinstance(value, dict):
            inner = flatten_numbers(value, name + "/")
            out.update(inner)
            domains = [v for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if key.endswith("_acc") and domains and len(domains) == len(value):
                out[f"{name}/mean"] = sum(domains) / len(domains)
    return out


def config_params(config: dict[str, Any]) -> dict[str, str]:
    """The configuration as flat string params (``hparams.NAME`` for the method's own)."""
    params: dict[str, str] = {}
    for key, value in sorted(config.items()):
        if isinstance(value, dict):
            params.update({f"{key}.{k}": str(v) for k, v in sorted(value.items())})
        elif isinstance(value, list):
            params[key] = ",".join(map(str, value))
        else:
            params[key] = str(value)
    return params


class Tracker:
    """One sink. ``start`` may raise :class:`TrackerError`; the other calls may raise anything
    (:class:`Trackers` catches and drops the tracker)."""

    name = ""
    extra = ""  # the pip extra that installs its package
    module = ""  # the module it imports
    option, state_key = "", ""  # the run setting naming where it logs, and that place's key in tracking.json

    def __init__(self, config, out: Path, state: dict[str, Any] | None):
        self.config, self.out, self.state = config, out, dict(state or {})

    @classmethod
    def check_installed(cls) -> None:
        try:
            __import__(cls.module)
        except ImportError:
            raise ConfigError(f"--tracker {cls.name} needs the {cls.module} package: "
                              f"pip install -c constraints.txt 'fedstyle[{cls.extra}]' (or drop --tracker {cls.name})") from None

    @classmethod
    def probe(cls, config) -> None:
        """Raise :class:`TrackerError` when the place it logs to does not answer (default: nothing to ask)."""

    @classmethod
    def describe(cls, state: dict[str, Any]) -> str:
        """What tracking.json's ``state`` names, for messages."""
        return f"{cls.name} logs at {state.get(cls.state_key)}"

    @classmethod
    def close(cls, state: dict[str, Any]) -> None:
        """--restart: end the run ``state`` names if it is still open (default: nothing stays open)."""

    def start(self, resumed: bool) -> dict[str, Any]:
        """Open the sink; return what tracking.json keeps to reopen it on resume."""
        raise NotImplementedError

    def log(self, numbers: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def finish(self, files: list[Path], status: str) -> None:
        raise NotImplementedError


TRACKERS: Registry[type[Tracker]] = Registry("tracker")


def register_tracker(cls: type[Tracker]) -> type[Tracker]:
    return TRACKERS.register(cls.name)(cls)


def check_trackers(config) -> None:
    """Before anything is written: known tracker names, their packages installed."""
    for name in config.trackers:
        if name not in TRACKERS:
            raise ConfigError(f"--tracker {name!r} is not one of {', '.join(TRACKERS.names())}")
        TRACKERS.get(name).check_installed()
    if len(set(config.trackers)) != len(config.trackers):
        raise ConfigError(f"--tracker is given twice: {', '.join(config.trackers)}; give each tracker once")
    for option, tracker in (("mlflow_uri", "mlflow"), ("tensorboard_dir", "tensorboard")):
        if getattr(config, option) is not None and tracker not in config.trackers:
            raise ConfigError(f"--{option.replace('_', '-')} is where --tracker {tracker} logs, and no --tracker "
                              f"{tracker} is given: add --tracker {tracker} or drop --{option.replace('_', '-')}")


def resolve_locations(config):
    """``config`` with its tracker locations absolute, as config.json keeps them: a run's coordinator
    may log from another folder (a Flower deployment's ServerApp runs in RUN_DIR/flower)."""
    if "mlflow" in config.trackers:
        uri = config.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or "./mlruns"
        if "://" not in uri and not uri.startswith("file:"):
            uri = Path(uri).resolve().as_uri()  # a folder: an absolute file store URI
        config = config.updated(mlflow_uri=uri)
    if config.tensorboard_dir is not None:
        config = config.updated(tensorboard_dir=str(Path(config.tensorboard_dir).resolve()))
    return config


class Trackers:
    """The run's trackers together: started with the round loop, fed each row, finished at the end."""

    def __init__(self, config, out: Path):
        self.out = out
        self.saved = read_tracking_state(out)
        self.active: list[Tracker] = [TRACKERS.get(name)(config, out, self.saved.get(name)) for name in config.trackers]

    def start(self, past_rows: Iterable[dict[str, Any]]) -> None:
        """Open every tracker; one new to this run directory first logs the rows already done.

        Each run is named in tracking.json as soon as it exists (a kill then leaves none unnamed); when
        one tracker cannot start (or the start is interrupted), those already started are closed
        (FAILED / KILLED), never left RUNNING."""
        past_rows, started = list(past_rows), []
        try:
            for tracker in list(self.active):
                resumed = tracker.name in self.saved
                try:
                    self.saved[tracker.name] = tracker.start(resumed)
                except TrackerError:
                    raise
                except Exception as err:  # the package's own errors (connection refused, bad URI ...)
                    raise TrackerError(f"--tracker {tracker.name} could not start: {err}; fix its settings "
                                       f"(--mlflow-uri, --tensorboard-dir) or drop --tracker {tracker.name}") from err
                started.append(tracker)
                atomic_write_json(self.out / TRACKING_FILE, self.saved)
                if not resumed:
                    for row in past_rows:
                        self._log_one(tracker, row)
        except BaseException as err:
            self.active = [t for t in started if t in self.active]
            self.finish("KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
            raise

    def log_row(self, row: dict[str, Any]) -> None:
        for tracker in list(self.active):
            self._log_one(tracker, row)

    def _log_one(self, tracker: Tracker, row: dict[str, Any]) -> None:
        if row.get("event") == "setup":
            numbers, step = flatten_numbers({k: v for k, v in row.items() if k != "event"}, "setup/"), 0
        elif "round" in row and "event" not in row:
            numbers, step = flatten_numbers({k: v for k, v in row.items() if k != "round"}), int(row["round"])
        else:  # runtime events (Flower dropouts) stay in metrics.jsonl
            return
        self._guard(tracker, lambda: tracker.log(numbers, step))

    def finish(self, status: str = "FINISHED") -> None:
        """Hand the run's files over and close; ``status`` FINISHED, FAILED or KILLED (interrupted)."""
        files = [self.out / name for name in ARTIFACTS if (self.out / name).is_file()]
        files += sorted(self.out.glob("*.png"))
        for tracker in list(self.active):
            self._guard(tracker, lambda t=tracker: t.finish(files, status))
        self.active = []

    def _guard(self, tracker: Tracker, call) -> None:
        try:
            call()
        except Exception as err:  # the run goes on: metrics.jsonl is its record
            warnings.warn(f"--tracker {tracker.name} failed and is dropped for the rest of this run ({err}); "
                          f"metrics.jsonl has every round", stacklevel=3)
            if tracker in self.active:
                self.active.remove(tracker)


def read_tracking_state(out: Path) -> dict[str, Any]:
    path = out / TRACKING_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        print(f"fedstyle: warning: {path} is damaged; the trackers start new runs", file=sys.stderr)
        return {}
    return state if isinstance(state, dict) else {}


def probe_trackers(config) -> None:
    """Before anything is written (a new run, a resume): every tracker's server answers in seconds."""
    check_trackers(config)
    for name in config.trackers:
        TRACKERS.get(name).probe(config)


def probe_mlflow_server(uri: str) -> None:
    """A tracking server (http/https) must answer ``/health`` within PROBE_SECONDS with a 2xx status.

    Any other answer is a server that cannot take the run: a 503 from a server that is starting or
    overloaded would otherwise pass, and MLflow's client then retries it for minutes with nothing printed
    (260 s measured). Credentials and TLS settings are sent as MLflow's client sends them, so a server
    behind basic auth or a token answers 2xx when they are right and 401/403, named as such, when not."""
    import requests

    if not uri.startswith(("http://", "https://")):
        return  # a file store or a database: opened in place, nothing to wait for
    insecure = os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true"
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    try:
        answer = requests.get(uri.rstrip("/") + "/health", timeout=PROBE_SECONDS,
                              verify=False if insecure else os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or True,
                              cert=os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH"),
                              auth=(user, password) if user and password else None,
                              headers={"Authorization": f"Bearer {token}"} if token else None)
    except requests.RequestException as err:
        if isinstance(err, requests.Timeout):
            reason = f"no answer in {PROBE_SECONDS:g} s"
        else:  # urllib3 nests the cause: "... [Errno 111] Connection refused')"
            found = re.search(r"\[Errno -?\d+\] ([^'\")]+)|\[SSL[^\]]*\] ([^'\"(]+)", str(err))
            reason = (found.group(1) or found.group(2)).strip() if found else type(err).__name__
        raise TrackerError(f"--tracker mlflow: no MLflow server answers at {uri} ({reason}); start it, fix "
                           "--mlflow-uri (or $MLFLOW_TRACKING_URI), or drop --tracker mlflow") from None
    if 200 <= answer.status_code < 300:
        return
    if answer.status_code in (401, 403):
        raise TrackerError(f"--tracker mlflow: the MLflow server at {uri} refuses the credentials (HTTP "
                           f"{answer.status_code}); set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
                           "(or MLFLOW_TRACKING_TOKEN), or drop --tracker mlflow")
    raise TrackerError(f"--tracker mlflow: the MLflow server at {uri} is not ready (its /health answers HTTP "
                       f"{answer.status_code}); wait for it, fix --mlflow-uri (or $MLFLOW_TRACKING_URI), or drop "
                       "--tracker mlflow")


#: MLflow's own HTTP retries while a run trains (its defaults, 7 retries with backoff factor 2 and a 120 s
#: timeout, stall a run for minutes on a server that went down); a user's own settings win
MLFLOW_HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                      "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def bound_mlflow_retries() -> None:
    """Set :data:`MLFLOW_HTTP_BOUNDS` where the user has not: a server that fails mid-run costs seconds,
    then the tracker is dropped with one warning and metrics.jsonl goes on."""
    for name, value in MLFLOW_HTTP_BOUNDS.items():
        os.environ.setdefault(name, value)


@register_tracker
class MLflowTracker(Tracker):
    """An MLflow run per fedstyle run, in the experiment ``$MLFLOW_EXPERIMENT_NAME`` (default fedstyle)."""

    name, extra, module = "mlflow", "mlflow", "mlflow"
    option, state_key = "mlflow_uri", "uri"
    #: MLflow's per-request limits of log_batch
    MAX_PARAMS, MAX_METRICS = 100, 1000

    @classmethod
    def probe(cls, config) -> None:
        probe_mlflow_server(resolve_locations(config).mlflow_uri)

    @classmethod
    def describe(cls, state: dict[str, Any]) -> str:
        return f"MLflow run {state.get('run_id')} at {state.get('uri')}"

    @classmethod
    def close(cls, state: dict[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        if not state.get("run_id") or not state.get("uri"):
            return
        probe_mlflow_server(state["uri"])
        bound_mlflow_retries()
        if state["uri"].startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=state["uri"])
        if client.get_run(state["run_id"]).info.status == "RUNNING":
            client.set_terminated(state["run_id"], status="KILLED")

    def start(self, resumed: bool) -> dict[str, Any]:
        from mlflow.tracking import MlflowClient

        bound_mlflow_retries()
        uri = self.state.get("uri") or resolve_locations(self.config).mlflow_uri
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        if resumed and self.state.get("run_id"):
            self.run_id = self.state["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment_id = self._experiment_id(os.environ.get("MLFLOW_EXPERIMENT_NAME", "fedstyle"))
            label = self.config.label or self.config.method
            run = self.client.create_run(experiment_id, run_name=f"{label} seed {self.config.seed}",
                                         tags={"fedstyle.run_dir": str(self.out.resolve()),
                                               "fedstyle.method": self.config.method,
                                               "fedstyle.dataset": self.config.dataset})
            self.run_id = run.info.run_id
            self._log_params(config_params(self.config.to_dict()))
        return {"uri": uri, "run_id": self.run_id}

    def _experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # a sweep's other worker created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), self.MAX_PARAMS):
            self.client.log_batch(self.run_id, params=items[i:i + self.MAX_PARAMS])

    def log(self, numbers: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        items = [Metric(_METRIC_NAME.sub("_", k), v, stamp, step) for k, v in numbers.items()]
        for i in range(0, len(items), self.MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=items[i:i + self.MAX_METRICS])

    def finish(self, files: list[Path], status: str) -> None:
        for path in files:
            self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, status=status)


@register_tracker
class TensorBoardTracker(Tracker):
    """Event files for TensorBoard's scalars, text and images dashboards."""

    name, extra, module = "tensorboard", "tensorboard", "tensorboard"
    option, state_key = "tensorboard_dir", "dir"

    @classmethod
    def describe(cls, state: dict[str, Any]) -> str:
        return f"TensorBoard event files in {state.get('dir')}"

    def start(self, resumed: bool) -> dict[str, Any]:
        from torch.utils.tensorboard import SummaryWriter

        folder = self.state.get("dir") or self.config.tensorboard_dir or str(self.out / TENSORBOARD_DIR)
        try:
            self.writer = SummaryWriter(log_dir=folder)
        except OSError as err:
            raise TrackerError(f"cannot write TensorBoard logs to {folder}: {err.strerror or err}; "
                               "give a writable --tensorboard-dir") from None
        if not resumed:
            self.writer.add_text("config", "```\n" + self.config.to_json() + "\n```", 0)
        return {"dir": str(Path(folder).resolve())}

    def log(self, numbers: dict[str, float], step: int) -> None:
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, files: list[Path], status: str) -> None:
        if status == "FINISHED":
            import matplotlib.image

            for path in files:
                if path.suffix == ".png":
                    image = matplotlib.image.imread(path)[..., :3]  # RGBA PNG -> RGB, floats in [0, 1]
                    self.writer.add_image(path.stem, image, 0, dataformats="HWC")
                elif path.name == "summary.json":
                    self.writer.add_text("summary", "```\n" + path.read_text() + "\n```", 0)
        self.writer.close()
