"""Same config and seed under the simulator, ``--backend flower-sim`` and ``fedstyle deploy``: same metrics?

FedAvg and CCST (``style_backend=fft``) on digits4, MNIST held out, one client per source domain
(3 sites), 3 rounds; every runtime with one torch thread. Prints each run's MNIST accuracy and
whether its metrics.jsonl evaluation lines (accuracies, losses, bytes; not times) equal the simulator's.

    OMP_NUM_THREADS=1 python benchmarks/flower_equivalence.py [--out DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch

from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.runner import run_experiment, start_run_dir
from fedstyle.runtimes.flower.certs import make_certificates
from fedstyle.runtimes.flower.deployment import DeploySettings, deploy_run

METHODS = {"fedavg": {}, "ccst": {"style_backend": "fft"}}


def evaluations(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in lines if "event" not in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="keep the run directories here (default: a temporary folder)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # the sites' processes inherit it
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        make_certificates(root / "certs")
        for method, hparams in METHODS.items():
            config = RunConfig(method=method, hparams=hparams, dataset="digits4", targets=["mnist"],
                               partition="per_domain", clients=3, rounds=args.rounds, seed=0, device="cpu")
            sim = run_experiment(config, root / f"{method}-sim", quiet=True)
            fsim = run_experiment(config.updated(backend="flower-sim"), root / f"{method}-flower-sim", quiet=True)
            start_run_dir(config, root / f"{method}-deploy", quiet=True)
            dep = deploy_run(root / f"{method}-deploy", DeploySettings(sites=3, certs=str(root / "certs")),
                             quiet=True, rounds=config.rounds)
            reference = evaluations(root / f"{method}-sim")
            for name, summary in (("simulator", sim), ("flower-sim", fsim), ("deployment", dep)):
                same = evaluations(root / f"{method}-{name.replace('simulator', 'sim').replace('deployment', 'deploy')}")
                print(f"{method:7s} {name:11s} mnist {100 * summary['targets']['mnist']['last']:.2f} %  "
                      f"metrics identical to the simulator: {same == reference}")


if __name__ == "__main__":
    main()
