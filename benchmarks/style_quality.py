"""Style-transfer quality on digits4 (issue 3, criteria a and b; see fedstyle/style/transfer/quality.py).

Every domain's test images (--test-per-domain, seeded) are restyled to every other domain's overall
style (from its remaining, training images) and to single-image styles of other domains.

(a) mean distance of the output's style to the target, d = ||mu - mu_t|| + ||sigma - sigma_t|| of the
    backend's encoder features at the AdaIN stage, over the content image's distance: pass if <= 0.5.
(b) accuracy of a ConvNet trained on the original training images (all four domains, --epochs),
    on the original test images and on the restyled ones: pass if restyled >= 0.8 x original.

    python benchmarks/style_quality.py [--backend lite] [--hp decoder_weights=PATH] [--device cpu]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import torch

from fedstyle.algorithms.hparams import parse_assignments
from fedstyle.data import load_dataset
from fedstyle.io import atomic_write_json
from fedstyle.style.transfer import TRANSFER_BACKENDS
from fedstyle.devices import resolve_device
from fedstyle.style.transfer.quality import measure_quality


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="lite")
    parser.add_argument("--hp", action="append", default=[], metavar="NAME=VALUE", help="backend option")
    parser.add_argument("--test-per-domain", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=3, help="classifier epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args()

    device = resolve_device(args.device)
    started = time.perf_counter()
    backend = TRANSFER_BACKENDS.get(args.backend)(device=device, **parse_assignments(args.hp))
    dataset = load_dataset("digits4", progress=False)
    result = measure_quality(backend, dataset, args.test_per_domain, args.epochs, args.seed, device)
    seconds = time.perf_counter() - started

    overall, single = result["overall"], result["single"]
    acc0, acc1 = result["accuracy_original"], result["accuracy_restyled"]
    print(f"`{' '.join(['python benchmarks/style_quality.py'] + [shlex.quote(a) for a in sys.argv[1:]])}` "
          f"({args.backend}, encoder {backend.encoder_id}, device {device.type}, {seconds:.0f} s)\n")
    print("| criterion | target style | content -> target | output -> target | ratio | pass |")
    print("|---|---|---|---|---|---|")
    for name, shift in (("overall (other domain, CCST Eq. 8)", overall), ("single image (other domain)", single)):
        print(f"| (a) style distance | {name} | {shift.content_distance:.3f} | {shift.output_distance:.3f} | "
              f"{shift.ratio:.2f} | {'yes' if shift.ratio <= 0.5 else 'NO'} (<= 0.5) |")
    print(f"| (b) ConvNet accuracy | original -> restyled (overall) | {acc0:.3f} | {acc1:.3f} | {acc1 / acc0:.2f} | "
          f"{'yes' if acc1 >= 0.8 * acc0 else 'NO'} (>= 0.8) |")
    print("\nper pair (a), overall style: content domain -> style domain: ratio")
    print(", ".join(f"{r['content']}->{r['style']} {r['after'] / r['before']:.2f}" for r in result["pairs"]))
    print("\nper pair (b), restyled accuracy:")
    print(", ".join(f"{r['content']}->{r['style']} {r['accuracy']:.2f}" for r in result["pairs"]))
    if args.json:
        payload = {"command": sys.argv, "encoder": backend.encoder_id, "seconds": seconds, "pairs": result["pairs"],
                   "overall": vars(overall), "single": vars(single), "accuracy_original": acc0,
                   "accuracy_restyled": acc1, "torch": torch.__version__}
        atomic_write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
