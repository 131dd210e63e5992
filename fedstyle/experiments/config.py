"""Run configuration: one dataclass, read from a TOML file and/or command-line flags.

Each field carries its own help text and flag name; the ``fedstyle run`` parser is generated
from these fields, so the CLI, the TOML keys and ``config.json`` can never drift apart.
Precedence: defaults < TOML file (``--config``) < flags.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import tomllib

from fedstyle.errors import ConfigError

SELECTIONS = ("source_val", "heldout_val", "last", "oracle")
#: what an annotation's base type accepts, and how an error names it
_KINDS = {
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "list": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "dict": (lambda v: isinstance(v, Mapping), "a table of NAME = VALUE"),
}
TOPOLOGIES = ("star", "complete", "ring", "rgg", "erdos_renyi")
#: where a run is also logged (--tracker and its locations): never what it computes, so resume may
#: change them, grids reuse runs whatever they were, and reports do not count them as settings
TRACKER_SETTINGS = ("trackers", "mlflow_uri", "tensorboard_dir")
#: settings read only under another setting's value: setting -> (the deciding setting, the values it is read at)
APPLIES_WHEN: dict[str, tuple[str, tuple[str, ...]]] = {
    "radius": ("topology", ("rgg",)),
    "edge_prob": ("topology", ("erdos_renyi",)),
    "fraction": ("topology", ("star",)),
    "clients_per_round": ("topology", ("star",)),
    "lam": ("partition", ("lambda",)),
    "alpha": ("partition", ("dirichlet", "label_dirichlet")),
    "min_client_size": ("partition", ("dirichlet", "label_dirichlet")),
    "val_domain": ("protocol", ("ltdo",)),
    "source": ("protocol", ("single_source",)),
    "momentum": ("optimizer", ("sgd",)),
    "batchnorm_fix_round": ("batchnorm", ("train",)),
}


def inactive_settings(values: Mapping[str, Any]) -> set[str]:
    """The settings of a run config (``config.json``'s mapping) that its other settings leave unread
    (:data:`APPLIES_WHEN`): a report lists only the settings that shape its rows (no ``radius`` for a star run)."""
    return {name for name, (decider, at) in APPLIES_WHEN.items()
            if name in values and decider in values and values[decider] not in at}


def _opt(default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None, repeat: bool = False, **kw):
    meta = {"help": help, "flag": flag, "choices": choices, "repeat": repeat}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class RunConfig:
    # what to train
    method: str = _opt("fedavg", "method name (see `fedstyle methods`)")
    hparams: dict = _opt({}, "the method's own hyperparameters, NAME=VALUE (repeatable; see `fedstyle methods`)",
                         flag="--hp", repeat=True)
    # data
    dataset: str = _opt("digits4", "dataset name (see `fedstyle data list`), or hf:OWNER/NAME for a Hugging Face "
                        "dataset (e.g. hf:flwrlabs/pacs; pip install 'fedstyle[hf]'; read from its cache, offline "
                        "with HF_HUB_OFFLINE=1)")
    data_root: str | None = _opt(None, "folder of a folder dataset (root/<domain>/<class>/<image>) or of fashion4's idx files")
    skip_bad_images: bool = _opt(False, "skip unreadable images (counted and reported) instead of stopping")
    resolution: int | None = _opt(None, "image side in pixels (default: the dataset's)")
    input_resolution: int | None = _opt(None, "the model's input side when larger than the stored --resolution: "
                                        "images are cached at --resolution and resized on the device after the "
                                        "crop and flip (DomainNet: --resolution 128 --input-resolution 224 caches "
                                        "29 GB instead of 88 GB; docs/scale.md)")
    per_class: int | None = _opt(None, "use at most N images per class in every domain, the same seeded pick in every "
                                 "run (default: all); e.g. 200 gives fashion4 PACS's size, ~2,000 images per domain")
    augment: str | None = _opt(None, "training augmentation: none, crop, crop_flip (default: the dataset's)")
    official_splits: bool = _opt(True, "use the dataset's official splits where it has them, as the papers do (PACS's "
                                 "*_kfold.txt lists, DomainNet's <domain>_train/_test.txt, Camelyon17-WILDS's metadata, "
                                 "a Hugging Face dataset's train/validation/test splits); --no-official-splits splits "
                                 "every domain by the seeded rule (--val-fraction)")
    image_column: str | None = _opt(None, "hf: datasets: the image column (default: image, or the known dataset's)")
    domain_column: str | None = _opt(None, "hf: datasets: the column whose values are the domains (default: domain)")
    label_column: str | None = _opt(None, "hf: datasets: the class label column (default: label)")
    # protocol
    protocol: str = _opt("lodo", "evaluation protocol (all: train on every domain, none held out: the model to "
                         "deploy)", choices=("lodo", "ltdo", "single_source", "all"))
    targets: list = _opt([], "held-out test domain (repeatable)", flag="--target", repeat=True)
    val_domain: str | None = _opt(None, "ltdo: the held-out validation domain")
    source: str | None = _opt(None, "single_source: the one training domain")
    val_fraction: float = _opt(0.1, "fraction of each source domain kept for source validation")
    # clients
    partition: str = _opt("domain", "how source data is split over clients",
                          choices=("domain", "per_domain", "dirichlet", "lambda", "label_dirichlet"))
    clients: int | None = _opt(None, "number of clients (domain partition: one per source domain)")
    fraction: float = _opt(1.0, "fraction of clients sampled per round (star)")
    clients_per_round: int = _opt(0, "clients sampled per round (overrides --fraction when > 0)")
    alpha: float = _opt(0.5, "Dirichlet concentration for dirichlet / label_dirichlet partitions")
    lam: float = _opt(0.1, "Bai et al. heterogeneity lambda in [0, 1] for the lambda partition")
    min_client_size: int = _opt(10, "smallest allowed client (Dirichlet partitions resample until met)")
    data_copies: int = _opt(1, "deal K shuffled copies of every training sample to the clients: K > 1 lets many clients "
                            "have enough samples (a sample then belongs to up to K clients, and may appear twice in "
                            "one: resampling with replacement across clients); 1: disjoint clients")
    # topology
    topology: str = _opt("star", "star (server) or a peer-to-peer graph", choices=TOPOLOGIES)
    radius: float = _opt(0.8, "rgg: connection radius in the unit square")
    edge_prob: float = _opt(0.5, "erdos_renyi: edge probability")
    # optimisation
    backbone: str = _opt("auto", "network: convnet, resnet18, resnet50, efficientnet_lite0 (auto: by dataset)")
    pretrained: bool = _opt(False, "start from ImageNet weights (resnets: torchvision's file from the torch hub cache, "
                            "$TORCH_HOME/hub/checkpoints, its hash checked; or --weights FILE)")
    weights: str | None = _opt(None, "torchvision checkpoint file for a resnet backbone")
    batchnorm: str = _opt("train", "BatchNorm in training: train (batch statistics, running ones updated), eval (the "
                          "running statistics, ImageNet's when pretrained, never updated; weights still train), frozen "
                          "(eval, weights fixed too)", choices=("train", "eval", "frozen"))
    batchnorm_momentum: float | None = _opt(None, "BatchNorm running-statistics momentum, PyTorch's convention (running = "
                                            "(1 - m) running + m batch): default the network's own, 0.1 (PyTorch) for "
                                            "the ResNets and the ConvNet, 0.01 (TensorFlow's decay 0.99) for "
                                            "efficientnet_lite0; 0.1 lets the running statistics follow a short "
                                            "fine-tuning with --batchnorm train")
    batchnorm_fix_round: int = _opt(0, "FixBN (Zhong et al., ICML 2024): with --batchnorm train, from this round on "
                                    "(1 = the first) every client normalises with the global model's running "
                                    "statistics, frozen, as evaluation does; 0 = never. Half the rounds is the "
                                    "paper's choice; it closes the gap batch statistics leave when each client "
                                    "holds one domain (docs/results/pretrained.md 'Fine-tuning with batch "
                                    "statistics'). "
                                    "With BatchNorm kept on the clients (FedBN, --hp local_bn=true) there are no "
                                    "global statistics: each client normalises with its own running statistics, "
                                    "frozen, and the run says so")
    rounds: int = _opt(20, "communication rounds (peer-to-peer: epochs of iterations)")
    local_epochs: int = _opt(1, "local epochs per round")
    local_steps: int = _opt(0, "local steps per round (overrides --local-epochs when > 0)")
    batch_size: int = _opt(32, "mini-batch size")
    lr: float = _opt(0.05, "learning rate")
    lr_schedule: str = _opt("cosine", "learning-rate schedule over rounds", choices=("constant", "cosine", "step"))
    optimizer: str = _opt("sgd", "client optimizer", choices=("sgd", "adam"))
    momentum: float = _opt(0.9, "SGD momentum")
    weight_decay: float = _opt(5e-4, "weight decay")
    head_lr_scale: float = _opt(1.0, "the linear head's learning rate as a multiple of --lr (the rest of the network "
                                "learns at --lr), for a fresh head on a pretrained backbone: with BatchNorm's batch "
                                "statistics Lite0's pooled features are 3x smaller than with ImageNet's, so its head "
                                "learns ~9x slower at the same lr (10 brought 30 centralised steps from loss 2.20 to "
                                "1.57; docs/results/pretrained.md 'Fine-tuning with batch statistics')")
    # run
    label: str | None = _opt(None, "name of this run's row in reports (default: the method with its options)")
    seed: int = _opt(0, "random seed (same config and seed give the same metrics)")
    device: str = _opt("auto", "cpu, cuda, cuda:1, mps or auto")
    deterministic: bool = _opt(False, "use torch's deterministic kernels, so that a GPU run repeats bit for bit on the "
                               "same machine (somewhat slower; an op without such a kernel warns, naming itself; not "
                               "yet checked on a GPU). The CPU's kernels are deterministic already: CPU results do not "
                               "change")
    backend: str = _opt("sim", "runtime: sim (fedstyle's in-process simulators) or flower-sim (Flower's simulation "
                        "engine on Ray, star topology, for many clients; needs pip install 'fedstyle[flower-sim]'); "
                        "same run directory")
    eval_every: int = _opt(1, "evaluate every k rounds (and always after the last)")
    target_eval: str = _opt("rounds", "when the held-out targets are measured: rounds (at every evaluation: "
                            "per-round curves in metrics.jsonl and the report) or end (the selected model, kept in "
                            "memory and in the checkpoint, and the last round's only: the same results in summary.json, much "
                            "faster where the targets are large; no target curves, no --selection oracle)", choices=("rounds", "end"))
    selection: str = _opt("auto", "model selection: source_val, heldout_val (ltdo), last, oracle (auto: source_val, "
                          "or heldout_val under ltdo)", choices=("auto",) + SELECTIONS)
    allow_oracle: bool = _opt(False, "permit --selection oracle (selects on the target: optimistic, labelled so)")
    # tracking: where the run is also logged (never what it computes)
    trackers: list = _opt([], "also log the run to an experiment tracker: mlflow or tensorboard (repeatable; needs "
                          "pip install 'fedstyle[mlflow]' or 'fedstyle[tensorboard]'); params, per-round metrics, "
                          "summary and plots", flag="--tracker", repeat=True)
    mlflow_uri: str | None = _opt(None, "--tracker mlflow: tracking URI or folder (default: $MLFLOW_TRACKING_URI, "
                                  "else the file store ./mlruns; no server or account needed)")
    tensorboard_dir: str | None = _opt(None, "--tracker tensorboard: log folder (default: RUN_DIR/tensorboard)")
    # scale: where the clients run and what they keep in memory (never what the run computes)
    state_budget: str = _opt("auto", "bytes of per-client state (FedDyn's gradients, FedBN's local layers ...) kept in "
                             "memory between rounds; the rest waits in the run directory (client_states/, safetensors) "
                             "and is loaded for the round's clients: auto (a tenth of this machine's memory), unlimited, "
                             "or a size such as 512MB, 2GiB, 0")
    client_batching: str = _opt("auto", "train a round's sampled clients as one batched computation (stacked weights, "
                                "torch.func.vmap; same results within float32 rounding, not bitwise): auto = batched on "
                                "CUDA where the method allows (`fedstyle methods`), sequential elsewhere (on a 2-core CPU "
                                "batching trained 350 samples/s against 1,000-1,500 sequential); on = wherever the method "
                                "allows (a method that cannot batch falls back with a warning saying why); off = one "
                                "client after another. --backend sim, star topology; Flower keeps one client per site",
                                choices=("auto", "on", "off"))
    ray_address: str | None = _opt(None, "flower-sim: join the running Ray cluster at this address (auto: the one "
                                   "`ray start` runs on this node; HOST:PORT: its head node; local or unset: start a "
                                   "private Ray instance)")
    client_cpus: float = _opt(1.0, "flower-sim: CPUs per client actor (a Ray resource; also the actor's torch threads)")
    client_gpus: float | None = _opt(None, "flower-sim: GPUs per client actor, a fraction shares a GPU (default: 0 "
                                     "with --device cpu; on CUDA the cluster's GPUs shared evenly by the actors its "
                                     "CPUs allow)")

    # ------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "config") -> "RunConfig":
        known = set(cls.field_names())
        values = dict(values)
        if "hparams" in values and not isinstance(values["hparams"], Mapping):
            raise ConfigError(f"{where}: [hparams] must be a table of NAME = VALUE")
        # TOML users naturally write `target = "mnist"`
        if "target" in values:
            t = values.pop("target")
            values["targets"] = [t] if isinstance(t, str) else list(t)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown setting {unknown[0]!r}; valid settings: {', '.join(sorted(known))}")
        config = cls(**values)
        config.check_types(where)
        return config

    @classmethod
    def from_toml(cls, path: str | Path) -> "RunConfig":
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"--config {path} is a directory; give the TOML file itself")
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = tomllib.loads(path.read_text())
        except UnicodeDecodeError:
            raise ConfigError(f"{path} is not a text file; give a TOML file") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path} is not valid TOML: {err}") from None
        return cls.from_mapping(data, where=str(path))

    def updated(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def resolved_selection(self) -> str:
        if self.selection == "auto":
            return "heldout_val" if self.protocol == "ltdo" else "source_val"
        return self.selection

    def check_types(self, where: str = "config") -> None:
        """Every setting against its declared type: one line naming the key, the value and the type.

        Integers are accepted where a number is expected (and stored as floats); booleans are not
        numbers, numbers are not booleans, numeric strings are not numbers, and NaN or infinity is
        no setting.
        """
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            annotation = str(f.type)
            optional = "None" in annotation
            base = annotation.replace("| None", "").replace("None |", "").strip()
            if value is None:
                if optional:
                    continue
                raise ConfigError(f"{where}: {f.name} has no value; it needs {_KINDS[base][1]}")
            accepts, description = _KINDS[base]
            if not accepts(value):
                raise ConfigError(f"{where}: {f.name} = {_short(value)} is not {description} ({base})")
            if base == "float":
                if not math.isfinite(value):
                    raise ConfigError(f"{where}: {f.name} = {value} is not a finite number")
                setattr(self, f.name, float(value))

    def validate(self) -> None:
        """Check option types, values and combinations that need no dataset (those are checked later)."""
        self.check_types()
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise ConfigError(f"--{f.name.replace('_', '-')} {getattr(self, f.name)!r} is not one of "
                                  f"{', '.join(map(str, choices))}")
        checks = [
            (self.rounds >= 1, "--rounds must be at least 1"),
            (self.label is None or self.label.isprintable(),  # one cell of a table (Markdown escapes its '|')
             f"--label {self.label!r} must be one line of printable text (it names a row of the report's "
             "tables)"),
            (self.local_epochs >= 1 or self.local_steps > 0, "--local-epochs must be at least 1"),
            (self.local_steps >= 0, "--local-steps must be >= 0"),
            (self.batch_size >= 2, "--batch-size must be at least 2 (BatchNorm needs two samples)"),
            (self.lr > 0, "--lr must be positive"),
            (self.batchnorm_momentum is None or 0 < self.batchnorm_momentum <= 1,
             f"--batchnorm-momentum must be in (0, 1], got {self.batchnorm_momentum}"),
            (self.batchnorm_fix_round >= 0, f"--batchnorm-fix-round must be >= 0 (0 = never), got "
                                            f"{self.batchnorm_fix_round}"),
            (self.batchnorm_fix_round == 0 or self.batchnorm == "train",
             f"--batchnorm-fix-round {self.batchnorm_fix_round} needs --batchnorm train (FixBN ends a phase of "
             f"batch statistics; with --batchnorm {self.batchnorm} there is none): drop one of them"),
            (self.batchnorm_fix_round <= self.rounds,
             f"--batchnorm-fix-round {self.batchnorm_fix_round} is after the last of --rounds {self.rounds}, so "
             f"BatchNorm would never switch: give a round from 1 to {self.rounds} (half is FixBN's choice) or 0"),
            (0 < self.fraction <= 1, "--fraction must be in (0, 1]"),
            (self.clients_per_round >= 0, "--clients-per-round must be >= 0"),
            (self.alpha > 0, "--alpha must be positive"),
            (0 <= self.lam <= 1, "--lam must be in [0, 1]"),
            (self.clients is None or self.clients >= 1, "--clients must be at least 1"),
            (self.per_class is None or self.per_class >= 1, f"--per-class must be at least 1, got {self.per_class}"),
            (self.input_resolution is None or self.input_resolution >= 8,
             f"--input-resolution must be at least 8 pixels, got {self.input_resolution}"),
            (self.eval_every >= 1, "--eval-every must be at least 1"),
            (0 <= self.val_fraction < 1, "--val-fraction must be in [0, 1)"),
            (self.radius > 0, "--radius must be positive"),
            (0 < self.edge_prob <= 1, "--edge-prob must be in (0, 1]"),
            (0 <= self.momentum < 1, f"--momentum must be in [0, 1), got {self.momentum}"),
            (self.weight_decay >= 0, "--weight-decay must be >= 0"),
            (self.head_lr_scale > 0, f"--head-lr-scale must be positive, got {self.head_lr_scale}"),
            (0 <= self.seed < 2**63, f"--seed must be a whole number in [0, 2^63), got {self.seed}"),
            (self.min_client_size >= 1, "--min-client-size must be at least 1"),
            (self.data_copies >= 1, f"--data-copies must be at least 1, got {self.data_copies}"),
            (self.client_cpus > 0, f"--client-cpus must be positive, got {self.client_cpus}"),
            (self.client_gpus is None or self.client_gpus >= 0, f"--client-gpus must be >= 0, got {self.client_gpus}"),
            (self.clients_per_round == 0 or self.clients is None or self.clients_per_round <= self.clients,
             f"--clients-per-round {self.clients_per_round} exceeds --clients {self.clients}"),
            (self.client_batching != "on" or self.topology == "star",
             f"--client-batching on batches a star round's clients; --topology {self.topology} trains its devices "
             "peer to peer, one by one: drop --client-batching (or use --topology star)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        self.check_scale_settings()
        from fedstyle.devices import parse_device_name

        parse_device_name(self.device)  # the name; whether this machine has it is checked when the run starts
        from fedstyle.experiments.tracking import check_trackers

        check_trackers(self)
        selection = self.resolved_selection()
        if selection == "oracle" and not self.allow_oracle:
            raise ConfigError("--selection oracle picks the model on the test domain (optimistic); "
                              "add --allow-oracle to do it anyway, and it will be labelled (oracle) in every table")
        if selection == "oracle" and self.target_eval == "end":
            raise ConfigError("--selection oracle selects on every round's target accuracy; --target-eval end "
                              "measures the targets only at the end: drop one of them")
        if self.protocol == "all" and (selection == "oracle" or self.targets):
            raise ConfigError("--protocol all holds no domain out: it has no target to "
                              + ("select on; use --selection source_val or last" if selection == "oracle"
                                 else f"test on; drop --target {' '.join(self.targets)}"))
        if selection == "heldout_val" and self.protocol != "ltdo":
            raise ConfigError("--selection heldout_val needs --protocol ltdo with a --val-domain")
        if selection == "source_val" and self.val_fraction == 0:
            raise ConfigError("--val-fraction 0 leaves no source validation data for --selection source_val; "
                              "give --val-fraction > 0 or choose --selection last")


    def batchnorm_fix_note(self) -> str | None:
        """One line for a run that fixes BatchNorm where it stays on the clients: FixBN (Zhong et al., 2024) fixes
        the global model's statistics, which FedBN's local BatchNorm does not have; what it fixes there instead."""
        if not self.batchnorm_fix_round:
            return None
        from fedstyle.algorithms import METHODS

        if self.method not in METHODS or not METHODS.get(self.method).resolve(self.hparams).get("local_bn"):
            return None
        return (f"--batchnorm-fix-round {self.batchnorm_fix_round} with BatchNorm kept on the clients (local_bn): "
                f"there are no global statistics to fix, so from round {self.batchnorm_fix_round} each client "
                "normalises with its own running statistics, frozen; the evaluation model averages them")

    def check_scale_settings(self) -> None:
        """--state-budget is a size; the Ray settings are for --backend flower-sim and well formed."""
        from fedstyle.federation.states import parse_budget

        parse_budget(self.state_budget)
        ray_flags = [flag for flag, given in (("--ray-address", self.ray_address is not None),
                                              ("--client-cpus", self.client_cpus != 1.0),
                                              ("--client-gpus", self.client_gpus is not None)) if given]
        if ray_flags and self.backend != "flower-sim":
            raise ConfigError(f"{', '.join(ray_flags)} only apply to --backend flower-sim (they place its clients on "
                              f"Ray); add --backend flower-sim, or drop them (--backend {self.backend} runs the "
                              "clients in this process)")
        if self.ray_address is not None and not _ray_address_ok(self.ray_address):
            raise ConfigError(f"--ray-address {self.ray_address!r} is not auto, local or HOST:PORT (the address "
                              "`ray start --head` printed, e.g. 10.0.0.5:6379)")


def _ray_address_ok(address: str) -> bool:
    if address in ("auto", "local"):
        return True
    host, sep, port = address.rpartition(":")
    return bool(sep and host and " " not in host and "/" not in host and port.isdigit() and 0 < int(port) < 65536)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
