"""The mutations of issue 49 §2, each of which a parity test must catch: a differential test outside the project
found that the first seven of these changes to fedstyle's reference modes passed every parity test of the day;
the last two guard the episodic step of FedDG (its parity test came later).

For each mutation this copies the project's files (``git ls-files``: tracked and untracked, not ignored) into a
temporary folder, applies the mutation there (one exact source replacement, which must occur once), runs the
parity tests that should catch it in a fresh process on that copy, and prints ``KILLED by <test>`` or ``SURVIVED``.
The working tree is never modified. First the same tests run on an unmutated copy, which must pass (otherwise a
"kill" would prove nothing). Exit status 1 when a mutation survives or the baseline fails.

Run: ``.venv/bin/python -m parity.mutations`` (``--only NAME`` for one; ``--no-baseline`` to skip the first run).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STABLEFDG = "tests/test_parity_stablefdg.py"
PARDON = "tests/test_parity_pardon.py"
FEDDG = "tests/test_parity_feddg_episodic.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    before: str
    after: str
    tests: tuple[str, ...]  # pytest node ids that must fail


MUTATIONS = (
    Mutation("k-means on [sigma, mu] instead of [mu, sigma]", "fedstyle/style/selection.py",
             "_, centres = kmeans(torch.cat([mu.flatten(1), sigma.flatten(1)], 1), k)",
             "_, centres = kmeans(torch.cat([sigma.flatten(1), mu.flatten(1)], 1), k)",
             (f"{STABLEFDG}::test_one_reference_step_matches_the_authors_loss_and_every_gradient[a]",)),
    Mutation("deterministic ties in level_order_indices", "fedstyle/style/oversample.py",
             "order = lowest[torch.randperm(len(lowest))]", "order = lowest",
             (f"{STABLEFDG}::test_one_reference_step_matches_the_authors_loss_and_every_gradient",)),
    Mutation("Phi biased (1/N)", "fedstyle/algorithms/stablefdg.py",
             "unbiased=reference, spread_eps=1e-6 if reference else 0.0",
             "unbiased=False, spread_eps=1e-6 if reference else 0.0",
             (f"{STABLEFDG}::test_phi_of_one_batch_matches_the_authors_style_collect",)),
    Mutation("Phi without its +1e-6", "fedstyle/algorithms/stablefdg.py",
             "unbiased=reference, spread_eps=1e-6 if reference else 0.0", "unbiased=reference, spread_eps=0.0",
             (f"{STABLEFDG}::test_phi_of_one_batch_matches_the_authors_style_collect",)),
    Mutation("derangement instead of the greedy pairing", "fedstyle/algorithms/stablefdg.py",
             'pairing="greedy" if self.hp["reference_code"] else "derangement"', 'pairing="derangement"',
             (f"{STABLEFDG}::test_server_pairing_matches_the_authors_loop",)),
    Mutation("sigma' clamped at 1e-6 instead of 0", "fedstyle/algorithms/stablefdg_pipeline.py",
             "sigma_floor=0.0 if reference else 1e-6", "sigma_floor=1e-6",
             (f"{STABLEFDG}::test_one_reference_step_matches_the_authors_loss_and_every_gradient[a]",)),
    Mutation("PARDON's triplet distance with eps 1e-5", "fedstyle/algorithms/paired_views.py",
             "positive = F.pairwise_distance(z, zp, eps=eps)", "positive = F.pairwise_distance(z, zp, eps=1e-5)",
             (f"{PARDON}::test_one_step_loss_and_gradients_are_the_codes",)),
    Mutation("FedDG's reference step second order", "fedstyle/algorithms/feddg_fft.py",
             'REFERENCE = {"meta_order": "first"}', 'REFERENCE = {"meta_order": "second"}',
             (f"{FEDDG}::test_two_episodic_steps_match_train_elcfs[code]",)),
    Mutation("FedDG's inner gradient not clamped", "fedstyle/algorithms/feddg_fft.py",
             'g = g.clamp(-hp["meta_clip"], hp["meta_clip"])', "g = g",
             (f"{FEDDG}::test_two_episodic_steps_match_train_elcfs[clamped]",)),
)


def project_copy(into: Path) -> Path:
    """The project's files (tracked and untracked, not ignored) copied under ``into``."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


def mutate(tree: Path, mutation: Mutation) -> None:
    path = tree / mutation.path
    text = path.read_text()
    if text.count(mutation.before) != 1:
        raise SystemExit(f"error: {mutation.path} holds {mutation.before!r} {text.count(mutation.before)} times, not "
                         f"once: update the mutation {mutation.name!r} to the current source")
    path.write_text(text.replace(mutation.before, mutation.after))


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int, list[str], str]:
    """(exit status, the failed node ids, pytest's summary line) of ``tests`` on ``tree``, in a fresh process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rf", *tests],
                         cwd=tree, env=env, capture_output=True, text=True)
    lines = run.stdout.strip().splitlines()
    failed = [m.group(1) for line in lines if (m := re.match(r"(?:FAILED|ERROR) (\S+)", line))]
    return run.returncode, failed, lines[-1] if lines else run.stderr.strip()[-300:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the mutation whose name contains this")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.only is None or args.only in m.name]
    survived, start = 0, time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedstyle-mutations-") as tmp:
        clean = project_copy(Path(tmp) / "clean")
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            status, failed, summary = run_tests(clean, tests)
            print(f"baseline (unmutated): {summary}", flush=True)
            if status != 0:
                print(f"the unmutated parity tests fail: {failed}", flush=True)
                return 1
        for i, mutation in enumerate(chosen):
            tree = Path(tmp) / f"mutant{i}"
            shutil.copytree(clean, tree)
            mutate(tree, mutation)
            status, failed, summary = run_tests(tree, mutation.tests)
            verdict = f"KILLED by {', '.join(failed)}" if status != 0 and failed else \
                "SURVIVED" if status == 0 else f"KILLED by an error ({summary})"
            survived += status == 0
            print(f"{mutation.name} ({mutation.path}): {verdict}", flush=True)
            shutil.rmtree(tree)
    print(f"{len(chosen) - survived} of {len(chosen)} mutations killed ({time.perf_counter() - start:.0f} s)")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
