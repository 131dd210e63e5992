"""What a style release's noise costs (issue 50, section 6): OpenDP's exact Gaussian (a deployment's ``os`` noise,
:class:`fedstyle.style.privacy.OSGaussian`) against the sampler it replaced (Box-Muller on 53-bit uniforms from
``secrets``, copied below as it was) and the simulation's seeded torch draws. Each times ``--releases`` releases of
one ``--dims``-number style vector; prints seconds per release and per number.

    python benchmarks/privacy_noise_cost.py [--dims 512] [--releases 1000]
"""

from __future__ import annotations

import argparse
import secrets
import time

import numpy as np
import torch

from fedstyle.style.privacy import OSGaussian, StylePrivacy


def former_box_muller(count: int) -> torch.Tensor:
    """The ``os`` sampler before issue 50 (``SystemNormal.randn``), kept here only to time it."""
    pairs = (count + 1) // 2
    raw = np.frombuffer(secrets.token_bytes(16 * pairs), dtype=np.uint64).reshape(pairs, 2)
    uniform = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    radius = np.sqrt(-2.0 * np.log(uniform[:, 0]))
    angle = 2.0 * np.pi * uniform[:, 1]
    return torch.from_numpy(np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count].copy())


def timed(release, releases: int) -> float:
    release()  # the first call loads the library
    start = time.perf_counter()
    for _ in range(releases):
        release()
    return (time.perf_counter() - start) / releases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, default=512)
    parser.add_argument("--releases", type=int, default=1000)
    args = parser.parse_args()
    sums = torch.randn(args.dims, dtype=torch.float64) * 10
    seeded = StylePrivacy(clip=1.0, noise=1.0, source="seeded")
    generator = seeded.generator(0)
    samplers = {
        "OpenDP make_gaussian (os, now)": lambda: OSGaussian().release(sums, seeded.std),
        "Box-Muller on secrets (os, before)": lambda: sums + former_box_muller(args.dims) * seeded.std,
        "torch seeded (simulation)": lambda: seeded.perturb(sums, generator),
    }
    print(f"{args.releases} releases of a {args.dims}-number vector, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    for name, release in samplers.items():
        seconds = timed(release, args.releases)
        print(f"{name:38s} {1e3 * seconds:9.3f} ms/release {1e6 * seconds / args.dims:9.3f} us/number")


if __name__ == "__main__":
    main()
