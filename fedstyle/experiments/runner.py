"""Run an experiment into a run directory, and resume an interrupted one.

A run directory holds::

    config.json        the fully resolved configuration
    partition.json     clients with their sample counts per domain and per class
    metrics.jsonl      one JSON object per evaluation, after a first {"event": "setup", ...} line
                       (style and stylization times, setup bytes) for methods with a setup exchange
    checkpoint.safetensors   the run state at the last evaluation (atomic)
    summary.json       the selected and last accuracies per held-out domain, time, bytes
    done               written last: the run is complete

Every random draw depends only on (seed, round, client), and the checkpoint holds every piece of
state that carries across rounds, so ``--resume`` ends with the same summary as an uninterrupted run.
What the run directory guarantees (lock, checksums, what resume accepts and restores, what is
cleaned up) is :mod:`fedstyle.experiments.rundir`'s.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from fedstyle.allocator import keep_freed_memory
from fedstyle.errors import ConfigError, FedstyleError, NonFiniteLossError
from fedstyle.experiments.backends import Backend, get_backend, refuse_peer_to_peer, register_backend, train_on
from fedstyle.experiments.build import Experiment, build_experiment
from fedstyle.experiments.checkpoint import CHECKPOINT, load_checkpoint, save_checkpoint
from fedstyle.experiments.config import TRACKER_SETTINGS, RunConfig
from fedstyle.experiments.tracking import TENSORBOARD_DIR, TRACKING_FILE, Trackers, probe_trackers, resolve_locations
from fedstyle.experiments.tracking_resume import close_logged_runs, log_finished_run, tracker_changes_on_resume
from fedstyle.environment import describe as describe_environment
from fedstyle.environment import differences as environment_differences
from fedstyle.environment import probe as probe_environment
from fedstyle.experiments.summary import Selector, evaluate_round, make_summary, mean, setup_record
from fedstyle.federation.evaluate import evaluate
from fedstyle.experiments.rundir import (
    CONFIG,
    DIVERGED,
    DONE,
    METRICS,
    SUMMARY,
    check_checkpoint_fits,
    check_new_run_dir,
    clean_leftovers,
    diverged_note,
    evaluation_rows,
    read_metrics_file,
    read_run_config,
    read_summary,
    refuse_deployment,
    RESUME_OPTIONS,
)
from fedstyle.federation.rounds import TrainingDivergedError, mean_metrics, merge_release_counts, releases_in_rows
from fedstyle.federation.states import STATES_DIR
from fedstyle.io import DirectoryLock, append_line, atomic_write_json, atomic_write_text, json_text
from fedstyle.federation.topology import save_graph_png
from fedstyle.partition import format_partition_table, write_partition_json

#: checkpoint prefix of the selected round's weights while their targets wait (--target-eval end)
SELECTED = "selected/"


class Reporter:
    """Progress over rounds: a tqdm bar with live loss and accuracy, silent with quiet=True."""

    def __init__(self, total: int, initial: int, quiet: bool, desc: str):
        self.quiet = quiet
        self.bar = None
        if not quiet:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="round", dynamic_ncols=True, file=sys.stderr)

    def info(self, message: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr)

    def step(self, postfix: dict[str, str]) -> None:
        if self.bar is not None:
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _number(value: float) -> str:
    """Counts as integers, measurements with two decimals."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.2f}"


def run_experiment(config: RunConfig, out: str | Path, *, quiet: bool = False) -> dict[str, Any]:
    """Train ``config`` into the run directory ``out`` (which must be new or empty), holding its lock."""
    out = Path(out)
    config.validate()  # every setting's type and range before anything is written
    check_backend(config)
    check_new_run_dir(out)
    probe_trackers(config)  # an MLflow server that does not answer: refused in seconds, before --out is touched
    created = not out.exists()
    try:
        lock = DirectoryLock(out).acquire()
    except OSError as err:
        raise ConfigError(f"cannot write to --out {out}: {err.strerror or err}") from None
    try:
        check_new_run_dir(out)  # again under the lock: another run may have started meanwhile
        exp = start_run_dir(config, out, quiet=quiet)
        return _train_on_backend(exp, out, quiet=quiet, checkpoint=None)
    except KeyboardInterrupt:
        # Interrupted (Ctrl-C, SIGTERM) before the first checkpoint: nothing to resume, and what was written
        # (config.json, partition.json, an empty metrics.jsonl) would block the same command; after it,
        # the run is resumable.
        if not (out / CHECKPOINT).exists():
            remove_new_run(out, created)
        raise
    except Exception as err:
        # Failed before its first checkpoint (a style backend's missing weights in the setup phase,
        # say): nothing to resume, so leave no half-written run directory behind to block a rerun.
        if not (out / CHECKPOINT).exists():
            remove_new_run(out, created)
        else:
            mark_diverged(out, err)
        raise
    finally:
        lock.release()


#: the errors of a run that diverged: resuming it repeats them
DIVERGENCE = (NonFiniteLossError, TrainingDivergedError)


def mark_diverged(out: Path, err: BaseException) -> None:
    """Record a divergence in ``out`` (:data:`~fedstyle.experiments.rundir.DIVERGED`), so that `run --out`,
    `run --resume` and `report` say what happened instead of offering to continue it."""
    if isinstance(err, DIVERGENCE):
        atomic_write_text(out / DIVERGED, f"{err}\n")


def check_backend(config: RunConfig) -> None:
    """Fail before writing anything when the runtime cannot run this config here."""
    backend = get_backend(config.backend)
    if backend.star_only:
        refuse_peer_to_peer(config, f"--backend {config.backend}")
    backend.check()


def remove_new_run(out: Path, created: bool) -> None:
    """Delete what a new run wrote into ``out`` (empty before it started, see check_new_run_dir)."""
    if created:
        shutil.rmtree(out, ignore_errors=True)
        return
    for entry in out.iterdir():
        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


def start_run_dir(config: RunConfig, out: Path, *, quiet: bool = False) -> Experiment:
    """Build the experiment and write the new run directory's config.json and partition.json."""
    check_backend(config)
    probe_trackers(config)  # `fedstyle deploy` comes here directly
    exp = build_experiment(resolve_locations(config), progress=not quiet)
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / CONFIG, exp.config.to_json() + "\n")
    except OSError as err:
        raise ConfigError(f"cannot write to --out {out}: {err.strerror or err}") from None
    write_partition_json(exp.client_specs, exp.dataset, out / "partition.json")
    if exp.graph is not None:
        save_graph_png(exp.graph, out / "graph.png")
    note = exp.config.batchnorm_fix_note()
    if note:
        print(f"fedstyle: note: {note}", file=sys.stderr)
    if not quiet:
        print(f"{exp.label}: {len(exp.client_specs)} clients, sources {', '.join(exp.split.sources)}; "
              f"held out {', '.join(exp.split.targets)}", file=sys.stderr)
        print(format_partition_table(exp.client_specs, exp.dataset), file=sys.stderr)
    return exp


def resume_experiment(out: str | Path, *, quiet: bool = False, device: str | None = None,
                      data_root: str | None = None, restart: bool = False, **settings: Any) -> dict[str, Any]:
    """Continue the run in ``out`` from its last checkpoint (or return its summary if complete).

    Only what cannot change the result may differ from the saved config: ``device``, ``data_root``
    (a moved dataset) and the other settings of :data:`~fedstyle.experiments.rundir.RESUME_OPTIONS`
    given as keywords (``state_budget``, ``ray_address``, ``client_cpus``, ``client_gpus``); None
    keeps the saved value. ``restart`` starts the run over from round 0 on purpose.
    """
    out = Path(out)
    unknown = sorted(set(settings) - set(RESUME_OPTIONS))
    if unknown:
        raise ConfigError(f"resuming cannot change {unknown[0]!r}: it would change the result; start a new run")
    read_run_config(out)  # a clear error for a directory that holds no run, before locking it
    refuse_deployment(out)  # a run keeps its runtime: a deployment resumes on a federation
    note = diverged_note(out)
    if note and not restart:
        raise ConfigError(f"{out}: the run diverged ({note}); resuming repeats it (the same seeds): "
                          f"start a new run with a lower --lr in another --out, or delete {out}")
    with DirectoryLock(out):
        clean_leftovers(out)
        config = read_run_config(out)
        if restart:
            close_logged_runs(out)  # a killed run's MLflow run is still RUNNING: end it before starting anew
            for name in (CHECKPOINT, METRICS, SUMMARY, DONE, TRACKING_FILE, DIVERGED):
                (out / name).unlink(missing_ok=True)  # the trackers start new runs too
            for folder in (STATES_DIR, TENSORBOARD_DIR):
                shutil.rmtree(out / folder, ignore_errors=True)
        changes = {k: v for k, v in (("device", device), ("data_root", data_root), *settings.items()) if v is not None}
        if (out / DONE).exists():
            summary = read_summary(out)
            if summary is not None:
                if set(changes) & set(TRACKER_SETTINGS):  # --tracker on a finished run: the tracker logs it
                    log_finished_run(config, changes, out, read_metrics_file(out / METRICS))
                return summary
            (out / DONE).unlink()  # summary.json lost or damaged: rebuilt from the checkpoint below
        checkpoint = load_checkpoint(out)
        if checkpoint is None:
            done = evaluation_rows(read_metrics_file(out / METRICS))
            if done:
                raise FedstyleError(
                    f"{out}/{CHECKPOINT} is missing but metrics.jsonl records {len(done)} evaluation(s): resuming "
                    f"would silently start over; restore the checkpoint, or start over on purpose with "
                    f"`fedstyle run --resume {out} --restart`")
        # trackers may be added, never dropped or moved once they logged (tracking.json): refused here, and
        # a tracking server is probed before the setup exchange (stylization can take minutes)
        config = resolve_locations(config.updated(**tracker_changes_on_resume(config, changes, out)))
        probe_trackers(config)
        exp = build_experiment(config, progress=not quiet)
        try:
            return _train_on_backend(exp, out, quiet=quiet, checkpoint=checkpoint)
        except DIVERGENCE as err:
            mark_diverged(out, err)
            raise


def _train_on_backend(exp: Experiment, out: Path, *, quiet: bool, checkpoint) -> dict[str, Any]:
    """The round loop on the configured runtime (a name of :data:`fedstyle.experiments.backends.BACKENDS`)."""
    return train_on(exp.config.backend, exp, out, quiet=quiet, checkpoint=checkpoint)


def train_experiment(exp: Experiment, out: Path, *, quiet: bool, checkpoint,
                     on_checkpoint: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The round loop into ``out`` on ``exp.simulator`` (the Flower runtimes give it their own transport)."""
    config, sim = exp.config, exp.simulator
    keep_freed_memory()  # a step's activations reused, not re-faulted from the kernel (fedstyle/allocator.py)
    selector = Selector(config.selection)
    start_round, elapsed = 0, 0.0
    # The setup exchange always runs (it is deterministic), also on resume: what it leaves outside
    # the checkpointed state — augmented client data, say — is rebuilt; the checkpoint then
    # restores the state and traffic counters as they were.
    tick = time.perf_counter()
    exp.algorithm.progress = not quiet  # setup work with a progress bar (stylization) follows --quiet
    sim.client_states.use_directory(out / STATES_DIR)  # client states beyond --state-budget wait here
    if checkpoint is None:
        sim.client_states.clear()  # from round 0: what an attempt killed before its first checkpoint wrote goes
    setup_info = sim.setup()
    notes: list[str] = []
    environment = probe_environment(exp.device)  # where this part of the run runs; the first part's is kept
    started_on = environment
    if checkpoint is not None:
        tensors, meta = checkpoint
        check_checkpoint_fits(sim.state_tensors(), tensors, out)
        selected = {k[len(SELECTED):]: v.to(exp.device) for k, v in tensors.items() if k.startswith(SELECTED)}
        sim.load_state_tensors({k: v.to(exp.device) for k, v in tensors.items() if not k.startswith(SELECTED)})
        sim.load_meta(meta["simulator"])
        start_round, elapsed = meta["round"], meta["seconds"]
        selector = Selector(**meta["selector"])
        if selector.must_keep_weights and not selected:
            raise FedstyleError(f"{out / CHECKPOINT} lacks the weights of round {selector.best_round}, the model "
                                "selected so far (--target-eval end keeps them there): restore the checkpoint, or "
                                f"start over with `fedstyle run --resume {out} --restart`")
        records, note = _rows_at_checkpoint(out, meta)
        notes += [note] if note else []
        started_on = meta.get("environment", environment)  # checkpoints before issue 53 recorded none
        moved = environment_differences(started_on, environment)
        if moved:
            print(f"fedstyle: warning: resuming {out} in another environment than it started in "
                  f"({describe_environment(moved)}); its numbers may differ from an uninterrupted run's",
                  file=sys.stderr)
    else:
        records, selected = [], {}
    if setup_info and not setup_record(records):
        # first line of metrics.jsonl; a resumed run keeps the original run's line (its timings)
        records.insert(0, {"event": "setup", **setup_info})
    atomic_write_text(out / METRICS, "".join(json_text(r) + "\n" for r in records))
    trackers = Trackers(config, out)  # --tracker: MLflow / TensorBoard get each row metrics.jsonl gets
    trackers.start(records)

    reporter = Reporter(config.rounds, start_round, quiet, desc=f"{exp.label} {config.dataset}")
    if start_round:
        reporter.info(f"resuming {out} after round {start_round}")
    for note in notes:
        reporter.info(note)
    if setup_info:
        reporter.info("setup exchange: " + ", ".join(f"{k} {_number(v)}" for k, v in setup_info.items()))
    try:
        last_loss = float("nan")
        since_eval: list[dict[str, float]] = []
        released = releases_in_rows(records)  # per-client style releases so far (a resumed run continues them)
        with open(out / METRICS, "a") as metrics_file:
            for r in range(start_round, config.rounds):
                result = sim.run_round(r)
                since_eval.append(result.metrics)
                released = merge_release_counts(released, result.releases)
                for event in result.events:  # Flower runs: dropouts and rejoins
                    append_line(metrics_file, json_text(event) + "\n")
                    records.append(event)
                last_loss = result.train_loss
                done_rounds = r + 1
                postfix = {"loss": f"{last_loss:.3f}"}
                if done_rounds % config.eval_every == 0 or done_rounds == config.rounds:
                    seconds = elapsed + time.perf_counter() - tick
                    record = evaluate_round(exp, done_rounds, last_loss, seconds, mean_metrics(since_eval),
                                            releases=released,
                                            targets=config.target_eval == "rounds" or done_rounds == config.rounds)
                    since_eval = []
                    if selector.update(record):  # --target-eval end: keep the chosen weights, measured at the end
                        selected = {k: v.detach().clone() for k, v in sim.eval_weights().items()} \
                            if selector.must_keep_weights else {}
                    append_line(metrics_file, json_text(record) + "\n")
                    records.append(record)
                    trackers.log_row(record)
                    save_checkpoint(out, {**sim.state_tensors(), **{SELECTED + k: v for k, v in selected.items()}}, {
                        "round": done_rounds, "seconds": seconds, "simulator": sim.meta(), "selector": selector.state(),
                        "metrics": records, "environment": started_on,
                    })
                    sim.checkpoint_saved()  # the checkpoint is in place: drop client-state files it does not list
                    if on_checkpoint is not None:
                        on_checkpoint(done_rounds)
                    postfix.update(src=f"{mean(record['source_val_acc'].values()):.3f}")
                    if record.get("target_acc"):  # none under --target-eval end's early rows or --protocol all
                        postfix.update(tgt=f"{mean(record['target_acc'].values()):.3f}")
                reporter.step(postfix)
    except KeyboardInterrupt:
        reporter.close()
        trackers.finish("KILLED")
        if (out / CHECKPOINT).exists():
            print(f"\ninterrupted; continue with: fedstyle run --resume {out}", file=sys.stderr)
        else:
            print("\ninterrupted before the first checkpoint: nothing to resume; give the same command again",
                  file=sys.stderr)
        raise
    except BaseException:
        trackers.finish("FAILED")
        raise
    finally:
        reporter.close()
    if selector.pending:  # --target-eval end: the selected round's weights, measured once
        selector.resolve(evaluate(exp.model, selected, exp.targets, exp.transform, exp.device))
    summary = make_summary(exp, records, selector)
    summary["environment"] = started_on
    if environment_differences(started_on, environment):
        summary["environment_resumed"] = environment  # where it was finished
    for warning in summary.get("warnings", []):
        print(f"fedstyle: warning: {warning}", file=sys.stderr)
    atomic_write_json(out / SUMMARY, summary)
    atomic_write_text(out / DONE, time.strftime("%Y-%m-%dT%H:%M:%S") + "\n")
    trackers.finish("FINISHED")
    return summary


def _rows_at_checkpoint(out: Path, meta: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The metrics rows the checkpoint covers, and a note when metrics.jsonl had to be restored.

    Checkpoints keep a copy of the rows (format 2); older ones fall back to the file's rows up to
    the checkpoint's round.
    """
    on_disk = read_metrics_file(out / METRICS)
    if "metrics" not in meta:
        return [r for r in on_disk if r.get("event") == "setup" or r.get("round", 0) <= meta["round"]], ""
    saved = list(meta["metrics"])
    if on_disk[: len(saved)] == saved:
        return saved, ""
    return saved, (f"metrics.jsonl held {len(evaluation_rows(on_disk))} readable evaluation(s) where the checkpoint "
                   f"covers {len(evaluation_rows(saved))}; restored its rows from the checkpoint")


register_backend(Backend("sim", train_experiment, star_only=False,
                         help="fedstyle's in-process simulators (star and peer-to-peer)"))
