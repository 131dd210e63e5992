"""What every parity generator and parity test shares.

A *generator* (``parity/<method>.py``) imports the authors' functions from a local checkout of their
repository (``--checkout PATH``; the commit it was written against is pinned in the script and checked),
runs them on fixed inputs with every random draw fixed, and writes inputs and outputs (and, for a
method with a loss, one step's loss and gradients) to ``tests/fixtures/parity/<method>.safetensors``
with the repository, the commit and the settings in the file's metadata. A *test*
(``tests/test_parity_<method>.py``) loads the fixture and runs fedstyle's ``reference_code`` mode on the
same inputs with the same draws: no authors' code is needed in CI, and none enters this project.

Model weights are not stored: both sides make them with :func:`seeded_weights` (a seeded normal draw
per tensor, keyed by the tensor's name in the authors' model), and the fixture keeps each tensor's sum
so a test can check it rebuilt the same weights. Gradients of large tensors are stored as a sketch
(:func:`gradient_record`): their norm, per-output-channel norms and a count sketch (``BUCKETS`` sums of
the elements with seeded random signs, each element in one seeded bucket). The sketch is linear, so the
sketch of a difference is the difference of the sketches, and its norm estimates the difference's norm
without bias (relative spread about sqrt(2 / BUCKETS), 18 %): all a 1e-3 tolerance needs, for a
fraction of the cost of Gaussian projections (``#proj``, still read in older fixtures).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "parity"
#: gradients with at most this many elements are stored whole
FULL_LIMIT = 32_768
#: Gaussian projections of a larger gradient in older fixtures (``#proj``)
SKETCH = 16
#: count-sketch buckets of a larger gradient (``#cs``)
BUCKETS = 64


# -- running a generator -------------------------------------------------------------------------
def parse_args(name: str, description: str, repository: str, commit: str,
               argv: list[str] | None = None) -> argparse.Namespace:
    """``--checkout PATH`` (required), ``--out FILE`` (default: the method's fixture), ``--allow-unpinned``."""
    parser = argparse.ArgumentParser(
        prog=f"python -m parity.{name}", description=description,
        epilog=f"Needs a local checkout of https://github.com/{repository} at commit {commit}: "
               f"git clone https://github.com/{repository} CHECKOUT && git -C CHECKOUT checkout {commit}")
    parser.add_argument("--checkout", required=True, type=Path, help="local checkout of the authors' repository")
    parser.add_argument("--out", type=Path, default=FIXTURES / f"{name}.safetensors", help="fixture to write")
    parser.add_argument("--allow-unpinned", action="store_true",
                        help="run on a checkout at another commit (the fixture records the commit found)")
    return parser.parse_args(argv)


def checkout_commit(path: Path) -> str | None:
    """The checkout's HEAD commit, or None when it is not a git work tree (an unpacked archive)."""
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def require_checkout(path: Path, commit: str, allow_unpinned: bool = False) -> str:
    """Checks that ``path`` is a checkout of the pinned ``commit``; returns the commit to record."""
    if not path.is_dir():
        raise SystemExit(f"error: {path} is not a folder; clone the authors' repository there first")
    found = checkout_commit(path)
    if found is None:
        if not allow_unpinned:
            raise SystemExit(f"error: {path} is not a git checkout, so its commit cannot be checked; "
                             f"clone it with git, or pass --allow-unpinned (the fixture then records 'unknown')")
        return "unknown"
    if not (found.startswith(commit) or commit.startswith(found)):
        if not allow_unpinned:
            raise SystemExit(f"error: {path} is at commit {found}, the generator was written against {commit}; "
                             f"git -C {path} checkout {commit}, or pass --allow-unpinned")
    return found


@contextlib.contextmanager
def importable(*folders: Path) -> Iterator[None]:
    """``folders`` first on ``sys.path`` while the block runs; modules imported from them are forgotten after
    (so two generators' same-named modules never mix in one process)."""
    folders = [str(Path(f).resolve()) for f in folders]
    before = set(sys.modules)
    sys.path[:0] = folders
    try:
        yield
    finally:
        for f in folders:
            sys.path.remove(f)
        for name in set(sys.modules) - before:
            module = sys.modules.get(name)
            origin = getattr(module, "__file__", None) or ""
            if any(origin.startswith(f) for f in folders):
                del sys.modules[name]


# -- inputs both sides can rebuild ---------------------------------------------------------------
def seeded(name: str, shape: tuple[int, ...] | torch.Size, seed: int = 0, scale: float = 1.0,
           offset: float = 0.0) -> torch.Tensor:
    """offset + scale * N(0, 1) of ``shape``, from a CPU generator seeded by ``seed`` and ``name``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(tuple(shape), generator=g, dtype=torch.float32) * scale + offset


def seeded_weights(shapes: Mapping[str, tuple[int, ...] | torch.Size], seed: int = 0) -> dict[str, torch.Tensor]:
    """A deterministic state for a model, keyed by the names in ``shapes`` (the authors' names):
    weights of rank >= 2 N(0, 2 / fan_in) (He), BatchNorm weights 1 + 0.1 N, biases and BatchNorm
    shifts 0.1 N, running means 0.1 N, running variances 1 + 0.1 |N|, counters 0."""
    out = {}
    for name, shape in shapes.items():
        shape = tuple(shape)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "num_batches_tracked":
            out[name] = torch.zeros(shape, dtype=torch.long)
        elif leaf == "running_var":
            out[name] = 1.0 + seeded(name, shape, seed).abs() * 0.1
        elif len(shape) >= 2:
            fan_in = 1
            for d in shape[1:]:
                fan_in *= d
            out[name] = seeded(name, shape, seed, scale=(2.0 / fan_in) ** 0.5)
        elif leaf == "weight":  # a norm layer's scale
            out[name] = seeded(name, shape, seed, scale=0.1, offset=1.0)
        else:
            out[name] = seeded(name, shape, seed, scale=0.1)
    return out


def weight_sums(state: Mapping[str, torch.Tensor], prefix: str = "weight_sum/") -> dict[str, torch.Tensor]:
    """float64 sum of every tensor: the fixture's check that a test rebuilt the generator's weights."""
    return {prefix + k: v.detach().double().sum().reshape(1) for k, v in state.items()}


# -- gradients -----------------------------------------------------------------------------------
def _projections(name: str, numel: int, count: int) -> Iterator[torch.Tensor]:
    for k in range(count):
        yield seeded(f"sketch/{name}/{k}", (numel,), 0)


def count_sketch(name: str, flat: torch.Tensor, buckets: int = BUCKETS) -> torch.Tensor:
    """(buckets,) float64: element i, times a random sign, added to a random bucket (both seeded by ``name``)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"count-sketch/{name}".encode()))
    bucket = torch.randint(buckets, (flat.numel(),), generator=g)
    sign = torch.randint(2, (flat.numel(),), generator=g, dtype=torch.int8).mul_(2).sub_(1)
    return torch.zeros(buckets, dtype=torch.float64).index_add_(0, bucket, flat.double() * sign)


def gradient_record(grads: Mapping[str, torch.Tensor], prefix: str = "grad/", full_limit: int = FULL_LIMIT,
                    sketch: str = "cs") -> dict[str, torch.Tensor]:
    """``grads`` as fixture tensors: whole when small (at most ``full_limit`` elements), else the sketch
    ``{prefix}{name}#norm``, ``#rows`` (norm per output channel) and ``#cs`` (:func:`count_sketch`;
    ``sketch="proj"``: ``#proj``, ``SKETCH`` Gaussian projections, as older fixtures hold)."""
    out = {}
    for name, g in grads.items():
        g = g.detach().float().cpu()
        if g.numel() <= full_limit:
            out[prefix + name] = g.clone()
            continue
        flat = g.reshape(-1)
        out[f"{prefix}{name}#norm"] = flat.norm().reshape(1)
        out[f"{prefix}{name}#rows"] = g.reshape(g.shape[0], -1).norm(dim=1)
        if sketch == "proj":
            out[f"{prefix}{name}#proj"] = torch.stack([p @ flat for p in _projections(name, flat.numel(), SKETCH)])
        else:
            out[f"{prefix}{name}#cs"] = count_sketch(name, flat).float()
    return out


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| (absolute when ``expected`` is 0), in float64."""
    a, e = actual.detach().double().cpu().reshape(-1), expected.detach().double().cpu().reshape(-1)
    if a.shape != e.shape:
        raise AssertionError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    denom = float(e.norm())
    return float((a - e).norm()) / (denom if denom > 0 else 1.0)


def gradient_errors(record: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
                    prefix: str = "grad/") -> dict[str, float]:
    """Relative error of each gradient in ``grads`` (named as in the fixture) against the fixture's record:
    exact for stored tensors, the worst of the norm, row-norm and projection errors for sketched ones."""
    errors = {}
    for name, g in grads.items():
        if prefix + name in record:  # stored whole
            errors[name] = relative_error(g, record[prefix + name])
        elif f"{prefix}{name}#cs" in record or f"{prefix}{name}#proj" in record:
            kind = "cs" if f"{prefix}{name}#cs" in record else "proj"
            mine = gradient_record({name: g}, prefix, full_limit=0, sketch=kind)
            errors[name] = max(relative_error(mine[f"{prefix}{name}{part}"], record[f"{prefix}{name}{part}"])
                               for part in ("#norm", "#rows", f"#{kind}"))
        else:
            raise AssertionError(f"the fixture has no gradient of {name!r}")
    missing = {k.split("#")[0][len(prefix):] for k in record if k.startswith(prefix)} - set(grads)
    if missing:
        raise AssertionError(f"the fixture has gradients the test did not compare: {sorted(missing)[:5]}")
    return errors


# -- fixtures ------------------------------------------------------------------------------------
@dataclass
class Fixture:
    tensors: dict[str, torch.Tensor]
    meta: dict[str, str]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    @property
    def settings(self) -> dict:
        return json.loads(self.meta.get("settings", "{}"))

    def group(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors under ``prefix`` (``prefix`` stripped from their names)."""
        return {k[len(prefix):]: v for k, v in self.tensors.items() if k.startswith(prefix)}


def write_fixture(path: Path, tensors: Mapping[str, torch.Tensor], *, repository: str, commit: str, generator: str,
                  description: str, settings: Mapping | None = None) -> Path:
    """Writes the fixture atomically (a temporary file renamed into place) and prints its size."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"repository": repository, "commit": commit, "generator": generator, "description": description,
            "settings": json.dumps(dict(settings or {}), sort_keys=True), "torch": torch.__version__,
            "created": datetime.date.today().isoformat()}
    tmp = path.with_suffix(".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=meta)
    os.chmod(tmp, 0o644)  # safetensors writes 0600; a fixture is data anyone may read
    os.replace(tmp, path)
    print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB, {len(tensors)} tensors) from {repository}@{commit[:12]}")
    return path


def read_fixture(name_or_path: str | Path) -> Fixture:
    """A fixture by method name (``tests/fixtures/parity/<name>.safetensors``) or path."""
    from safetensors import safe_open

    path = Path(name_or_path)
    if path.suffix != ".safetensors":
        path = FIXTURES / f"{name_or_path}.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"no parity fixture {path}; regenerate it with python -m parity.<method> --checkout DIR")
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for key in ("repository", "commit", "generator"):
        if not meta.get(key):
            raise AssertionError(f"parity fixture {path} lacks its {key!r} metadata")
    return Fixture(tensors, meta)
