"""Mutations of the style defence and its audit, each with the tests that must kill it (issues 36 and 50).

    python tests/privacy_mutations.py [--only N1 N14 ...] [--list]

For each mutation: copy the repository's fedstyle/, tests/ and parity/ (and pyproject.toml) to a temporary folder,
change one place of the code there (the original text must occur exactly once), run its killing tests in a fresh
pytest process on that copy, and print KILLED (a test failed) or SURVIVED (all passed). The unchanged tests are run
once first: they must pass. Exits 1 when a mutation survives or does not apply. A mutation whose killing test file
does not exist here (N7d: tests/test_site_noise_guard.py, from the privacy-site branch of issue 50) is reported
NEEDS <file> and does not fail the run. Not collected by pytest (no test_ prefix); a few minutes on 2 cores.
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

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("fedstyle", "tests", "parity", "pyproject.toml", "README.md", "docs", "constraints.txt")


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str  # relative to the repository root
    old: str  # a regular expression that must match exactly once
    new: str
    tests: tuple[str, ...]  # pytest node ids that must fail on the mutant


P = "tests/test_privacy_defence.py::"
R = "tests/test_privacy_released.py::"
K = "tests/test_audit_known_answers.py::"
S = "tests/test_style_privacy.py::"

MUTATIONS = (
    # issue 50, section 5
    Mutation("N1", "CCST's per-image styles clipped after the noise", "fedstyle/style/transfer/feature_adain.py",
             r"rows = clip_rows\((torch\.cat\(\[style\.tensors\[\"mean\"\], style\.tensors\[\"std\"\]\], 1\)"
             r"\.double\(\)), privacy\.clip\)\n(\s+)mean, std = privacy\.perturb\(rows, generator\)",
             r"rows = \1\n\2mean, std = clip_rows(privacy.perturb(rows, generator), privacy.clip)",
             (P + "test_ccst_per_image_styles_are_clipped_then_noised",)),
    Mutation("N14", "the overall style's second moments summed unclipped", "fedstyle/style/transfer/feature_adain.py",
             r"\(second \* scale\)\.sum\(0\)", "second.sum(0)",
             (P + "test_ccst_overall_style_sums_clipped_moments_then_noises_them",)),
    Mutation("N7c", "the OS noise drawn from a fixed-seed process-wide generator", "fedstyle/style/privacy.py",
             r"noisy = self\.mechanism\(flat\.numel\(\), std\)\(flat\.tolist\(\)\)",
             "noisy = (flat + std * torch.randn(flat.shape, dtype=torch.float64, generator=globals().setdefault("
             "'_PROCESS_NOISE', torch.Generator().manual_seed(1234)))).tolist()",
             (P + "test_two_fresh_processes_draw_different_os_noise",)),
    Mutation("N8b", "half the OS noise a copy of the other half (Box-Muller's sine half duplicated, in the sampler "
             "it replaced)", "fedstyle/style/privacy.py",
             r"noisy = self\.mechanism\(flat\.numel\(\), std\)\(flat\.tolist\(\)\)",
             "half = (flat.numel() + 1) // 2\n        noise = self.mechanism(half, std)([0.0] * half)\n"
             "        noisy = (flat + torch.tensor(noise + noise, dtype=torch.float64)[: flat.numel()]).tolist()",
             (P + "test_noise_coordinates_i_and_i_plus_half_are_uncorrelated",)),
    Mutation("N7d", "every Flower node treated as the simulation engine", "fedstyle/runtimes/flower/site.py",
             r"not in_simulation_engine\(self\.context\)", "False",
             ("tests/test_site_noise_guard.py",)),
    Mutation("N4b", "the canary's threshold chosen on the counting half", "fedstyle/audit/canary.py",
             r"thresholds = np\.unique\(np\.concatenate\(\[pick_a\[:, column\], pick_b\[:, column\], \[np\.inf\]\]\)\)"
             r"\n(\s+)fn, fp = rates\(pick_a\[:, column\], pick_b\[:, column\], thresholds\)",
             r"thresholds = np.unique(np.concatenate([count_a[:, column], count_b[:, column], [np.inf]]))"
             r"\n\1fn, fp = rates(count_a[:, column], count_b[:, column], thresholds)",
             (P + "test_the_canary_threshold_is_chosen_on_the_selection_half_only",)),
    Mutation("N4b'", "the canary's statistic and threshold both chosen on the counting half",
             "fedstyle/audit/canary.py",
             r"\n(\s+)column = int\(np\.argmax", r"\n\1pick_a, pick_b = count_a, count_b\n\1column = int(np.argmax",
             (P + "test_the_canary_bound_is_valid_over_many_audits_at_delta_005",)),
    # issue 50, section 4
    Mutation("E4a", "summary.json's eps from the clients' mean release count", "fedstyle/experiments/summary.py",
             r"most = max\(released\.values\(\), default=0\)",
             "most = round(sum(released.values()) / max(1, len(released)))",
             (R + "test_stablefdg_eps_is_the_busiest_senders_in_summary_and_audit_with_eval_every_4",)),
    Mutation("E4b", "the audit counts evaluation rows, not the logged per-client counts",
             "fedstyle/audit/accounting.py",
             r"logged = releases_in_rows\(records\)", "logged = {}",
             (R + "test_stablefdg_eps_is_the_busiest_senders_in_summary_and_audit_with_eval_every_4",
              R + "test_a_multi_round_ccst_run_is_one_release_everywhere")),
    # issue 36: the defence and the attacks' known answers
    Mutation("D1", "the sensitivity of replace-one taken as C (noise std z C)", "fedstyle/style/privacy.py",
             r"return 2\.0 \* self\.clip", "return self.clip", (S + "test_the_noise_has_std_z_times_2c",)),
    Mutation("D2", "the noise 10x smaller than claimed", "fedstyle/style/privacy.py",
             r"return self\.noise \* self\.sensitivity", "return self.noise * self.sensitivity / 10",
             (S + "test_the_noise_has_std_z_times_2c",)),
    Mutation("D3", "a deployment keeps the coordinator's seeded noise", "fedstyle/experiments/build.py",
             r'return config\.updated\(hparams=\{\*\*config\.hparams, "dp_noise_source": "os"\}\)', "return config",
             (S + "test_fedstyle_run_seeds_the_noise_a_deployment_draws_it_from_the_os",)),
    Mutation("A1", "weight decay left in the gradient read off an update", "fedstyle/audit/baseline.py",
             r"return \{k: g - weight_decay \* before\[k\] for k, g in grads\.items\(\)\}", "return dict(grads)",
             (K + "test_the_observed_gradient_is_the_loss_gradient_with_weight_decay_removed",)),
    Mutation("A2", "set membership scored against the public reference instead of the payload",
             "fedstyle/audit/playbook.py",
             r"set_membership_score\(vectors\(images\), shared, ",
             "set_membership_score(vectors(images), public_vectors.mean(0), ",
             (K + "test_a_planted_member_of_a_small_set_is_found",)),
    Mutation("A3", "the reconstruction replaced by the guess", "fedstyle/audit/reconstruction.py",
             r"recon = scored\[chosen\]", "recon = score_images(guess, truth01, truth_labels, surface.per_image, "
             "classify)",
             (K + "test_an_exact_per_image_style_reconstruction_beats_the_mean_image_guess",)),
)


def copy_repository(into: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif source.exists():
            shutil.copy2(source, into / name)


def run_tests(where: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(where), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *tests]
    done = subprocess.run(command, cwd=where, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, lines[-1] if lines else done.stderr.strip()[-200:]


def missing_files(tests: tuple[str, ...]) -> list[str]:
    return sorted({t.split("::")[0] for t in tests if not (ROOT / t.split("::")[0]).exists()})


def check_baseline(mutations: list[Mutation]) -> None:
    tests = tuple(dict.fromkeys(t for m in mutations if not missing_files(m.tests) for t in m.tests))
    with tempfile.TemporaryDirectory(prefix="fedstyle-mutant-") as tmp:
        copy_repository(Path(tmp))
        code, last = run_tests(Path(tmp), tests)
    if code != 0:
        sys.exit(f"the killing tests fail without any mutation ({last}); fix them first")
    print(f"unmutated: {len(tests)} killing tests pass ({last})")


def apply(mutation: Mutation, into: Path) -> bool:
    path = into / mutation.path
    text = path.read_text()
    found = len(re.findall(mutation.old, text))
    if found != 1:
        return False
    path.write_text(re.sub(mutation.old, lambda m: m.expand(mutation.new), text))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutations only")
    parser.add_argument("--list", action="store_true", help="list the mutations and their killing tests")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name:5s} {m.what}  [{m.path}]  <- {', '.join(m.tests)}")
        return 0
    check_baseline(chosen)
    bad = 0
    for m in chosen:
        start = time.perf_counter()
        missing = missing_files(m.tests)
        if missing:
            print(f"{m.name:5s} NEEDS {', '.join(missing)} (the privacy-site branch)  {m.what}")
            continue
        with tempfile.TemporaryDirectory(prefix="fedstyle-mutant-") as tmp:
            copy_repository(Path(tmp))
            if not apply(m, Path(tmp)):
                print(f"{m.name:5s} NOT APPLIED (the code to mutate is not found once in {m.path})  {m.what}")
                bad += 1
                continue
            code, last = run_tests(Path(tmp), m.tests)
        verdict = "KILLED" if code == 1 else "SURVIVED" if code == 0 else f"ERROR (pytest exit {code})"
        bad += verdict != "KILLED"
        print(f"{m.name:5s} {verdict:8s} {time.perf_counter() - start:5.0f} s  {m.what}  ({last})")
    print(f"{len(chosen) - bad} of {len(chosen)} mutations killed or waiting for their test file")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
