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

Running the authors' code as it is, on this machine, takes the same few tools in many generators, kept here:
:func:`stub_modules` (packages their files import but that are not installed, or must not run: stub modules
while the block runs, forgotten after; :func:`feddg_benchmark_imports` for PARDON's and the FedDG benchmark's
``src/server.py``), :func:`patched` (an attribute replaced while the block runs), :func:`no_cuda` (``.cuda()``
a no-op), :func:`recorder` / :func:`recording` / :func:`backward_calls` (a function or method wrapped to keep
what it returned: their random draws, losses, gradients), :class:`FixedDraws` (a scripted ``random`` /
``np.random``), :func:`load_functions` (some definitions of a script that runs a pipeline at import) and
:func:`generate` (a one-checkout generator's ``main``; every fixture's ``generator`` is :func:`generator_name`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import importlib.abc
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "parity"
#: gradients with at most this many elements are stored whole
FULL_LIMIT = 32_768
#: Gaussian projections of a larger gradient in older fixtures (``#proj``)
SKETCH = 16
#: count-sketch buckets of a larger gradient (``#cs``)
BUCKETS = 64


# -- running a generator -------------------------------------------------------------------------
def parse_args(name: str, description: str, repository: str, commit: str, argv: list[str] | None = None,
               others: Mapping[str, tuple[str, str]] | None = None) -> argparse.Namespace:
    """``--checkout PATH`` (required), ``--out FILE`` (default: the method's fixture), ``--allow-unpinned``.

    ``others`` names a generator's further checkouts, ``{"pardon": (repository, commit)}``: a required
    ``--pardon PATH`` (``args.pardon``), its repository and commit in the help and in the error when it is missing;
    the description gains " (also needs --pardon CHECKOUT)". Their commits are checked by the generator
    (:func:`require_checkout`), like ``--checkout``'s."""
    others = dict(others or {})
    description += "".join(f" (also needs --{option} CHECKOUT)" for option in others)
    parser = argparse.ArgumentParser(
        prog=f"python -m parity.{name}", description=description,
        epilog=f"Needs a local checkout of https://github.com/{repository} at commit {commit}: "
               f"git clone https://github.com/{repository} CHECKOUT && git -C CHECKOUT checkout {commit}")
    parser.add_argument("--checkout", required=True, type=Path, help="local checkout of the authors' repository")
    for option, (other_repository, other_commit) in others.items():
        parser.add_argument(f"--{option}", type=Path,
                            help=f"local checkout of https://github.com/{other_repository} at {other_commit}")
    parser.add_argument("--out", type=Path, default=FIXTURES / f"{name}.safetensors", help="fixture to write")
    parser.add_argument("--allow-unpinned", action="store_true",
                        help="run on a checkout at another commit (the fixture records the commit found)")
    args = parser.parse_args(argv)
    for option, (other_repository, other_commit) in others.items():
        if getattr(args, option.replace("-", "_")) is None:
            raise SystemExit(f"error: --{option} CHECKOUT is required: a checkout of "
                             f"https://github.com/{other_repository} at {other_commit}")
    return args


def generator_name(name: str) -> str:
    """What a fixture's ``generator`` metadata holds: the generator's path in the project, ``parity/<name>.py``."""
    return f"parity/{name}.py"


def generate(name: str, doc: str, repository: str, commit: str, run: Callable[[Path], Mapping[str, torch.Tensor]], *,
             description: str, settings: Mapping, argv: list[str] | None = None, threads: int | None = None) -> Path:
    """A generator's ``main`` for one checkout: parses the command line (:func:`parse_args`, the description the
    first line of ``doc``), checks the checkout (:func:`require_checkout`), sets torch's thread count to
    ``threads`` when given, runs ``run(checkout)`` and writes what it returns as the fixture (:func:`write_fixture`,
    ``generator`` = :func:`generator_name`)."""
    args = parse_args(name, doc.splitlines()[0], repository, commit, argv)
    found = require_checkout(args.checkout, commit, args.allow_unpinned)
    if threads is not None:
        torch.set_num_threads(threads)
    return write_fixture(args.out, run(args.checkout), repository=repository, commit=found,
                         generator=generator_name(name), description=description, settings=settings)


def checkout_commit(path: Path) -> str | None:
    """The checkout's HEAD commit, or None when it is not a git work tree (an unpacked archive)."""
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def require_checkout(path: Path, commit: str, allow_unpinned: bool = False) -> str:
    """Checks that ``path`` is a clean checkout of the pinned ``commit`` (no local change: :func:`checkout_changes`);
    returns the commit to record."""
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
    changed = checkout_changes(path)
    if changed:
        # the fixture would record a commit whose code did not make it: a dirty checkout is never accepted
        listed = ", ".join(changed[:3]) + (", ..." if len(changed) > 3 else "")
        raise SystemExit(f"error: {path} has local changes ({listed}), so its commit does not name the code that "
                         f"would run; git -C {path} stash -u (or git -C {path} checkout -- . && git -C {path} clean -fd)")
    return found


def checkout_changes(path: Path) -> list[str]:
    """The checkout's modified, staged, deleted or untracked files (``git status --porcelain``), except the bytecode
    Python writes when a generator imports the checkout's modules (``__pycache__``, ``*.pyc``)."""
    out = subprocess.run(["git", "-C", str(path), "status", "--porcelain"], capture_output=True, text=True, check=True)
    changed = [line[3:] for line in out.stdout.splitlines() if line.strip()]
    return [name for name in changed if "__pycache__" not in name and not name.endswith(".pyc")]


@contextlib.contextmanager
def importable(*folders: Path) -> Iterator[None]:
    """``folders`` first on ``sys.path`` while the block runs; modules imported from them are forgotten after
    (so two generators' same-named modules never mix in one process), namespace packages (a folder without
    ``__init__.py``, such as PARDON's ``src`` or FedSR's ``methods``) included."""
    folders = [str(Path(f).resolve()) for f in folders]
    before = set(sys.modules)
    sys.path[:0] = folders
    try:
        yield
    finally:
        # every origin read first, while sys.path holds the folders and every parent is still imported: a namespace
        # package's path is recomputed from its parent's, which must not be forgotten before its children are read
        gone = [name for name in set(sys.modules) - before
                if any(origin.startswith(f) for origin in _origins(sys.modules.get(name)) for f in folders)]
        for name in gone:
            del sys.modules[name]
        for f in folders:
            sys.path.remove(f)


def _origins(module) -> list[str]:
    """Where ``module`` was imported from: its file, or for a namespace package (no file) its folders."""
    origin = getattr(module, "__file__", None)
    if origin:
        return [origin]
    spec = getattr(module, "__spec__", None)
    if spec is not None and spec.origin is None and spec.submodule_search_locations is not None:
        return [str(location) for location in spec.submodule_search_locations]
    return []


# -- running the authors' code: stubs, patches, recordings --------------------------------------
@contextlib.contextmanager
def patched(owner: Any, **values: Any) -> Iterator[None]:
    """``owner.<name> = value`` for each of ``values`` while the block runs (a module's function, a class's
    method, an instance's attribute); after, each is as it was: the owner's own value put back, or the
    attribute removed where the owner had none of its own (it inherited it, or had none at all)."""
    missing = object()
    own = vars(owner)
    saved = {name: own.get(name, missing) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


@contextlib.contextmanager
def no_cuda() -> Iterator[None]:
    """``Tensor.cuda()`` and ``Module.cuda()`` return their object unchanged while the block runs: the authors'
    code that moves its tensors and models to the GPU runs on the CPU."""
    def same(self, *args, **kwargs):
        return self

    with patched(torch.Tensor, cuda=same), patched(nn.Module, cuda=same):
        yield


class _StubType(type):
    """A stub class whose every attribute is another stub class."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubType(name, (Stub,), {})


class Stub(metaclass=_StubType):
    """What any name of a stubbed module is: a class that can be subclassed and called with any arguments,
    whose instances can be called (giving another stub) and iterated (over nothing), and whose attributes,
    the class's and its instances', are stub classes again. Enough for code that names a stubbed package's
    classes and functions at import, or calls them where it does not matter (``wandb.log``, ``colored``)."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return Stub()

    def __iter__(self):
        return iter(())

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubType(name, (Stub,), {})


class _StubModule(types.ModuleType):
    """An empty module whose every attribute is a stub class (:class:`Stub`)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubType(name, (Stub,), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports each of ``names`` and every submodule of it as an empty package of stubs (:class:`_StubModule`)."""

    def __init__(self, names: Iterable[str]):
        self.names = tuple(names)

    def find_spec(self, fullname, path=None, target=None):
        if _under(fullname, self.names):
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def _under(name: str, roots: Iterable[str]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


@contextlib.contextmanager
def stub_modules(names: Iterable[str] = (),
                 attrs: Mapping[str, Mapping[str, Any]] | None = None) -> Iterator[None]:
    """Modules the authors' code imports but that are not installed here, or must not run, as stubs while
    the block runs.

    * Each of ``names``, and every submodule of it, imports as an empty package whose every attribute is a
      stub class (:class:`Stub`), through a finder first on ``sys.meta_path``: for packages the compared code
      names at import but never uses (``import wandb``, ``from wilds.common.grouper import ...``).
    * Each key of ``attrs`` is put in ``sys.modules`` as a plain module holding exactly the attributes given
      (``{"torchvision.models": {"resnet18": make}}``; ``{"models": {"__path__": [folder]}}`` makes a package
      of a folder without running its ``__init__.py``); one that is the child of another such module is also
      set as its attribute (``torchvision.models`` on ``torchvision``). A missing attribute raises as in
      any module. A key under a real package (``utils.args``) replaces just that module.

    After the block every one of these modules is forgotten (and any the process had under those names before
    is put back), so nothing stubbed outlives the generator's use of it."""
    names, attrs = tuple(names), dict(attrs or {})

    def stubbed(name: str) -> bool:
        return name in attrs or _under(name, names)

    saved = {name: module for name, module in sys.modules.items() if stubbed(name)}
    created = {}
    for name, values in attrs.items():
        created[name] = types.ModuleType(name)
        created[name].__dict__.update(values)
    for name, module in created.items():
        parent, _, child = name.rpartition(".")
        if parent in created:
            setattr(created[parent], child, module)
    finder = _StubFinder(names)
    sys.modules.update(created)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if stubbed(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


#: what PARDON-FedDG's ``src/server.py`` and ``src/client.py`` (a fork of the FedDG benchmark's) import at their
#: top but the compared functions never use: packages not installed here and their ``src/adain_net.py`` (the
#: AdaIN VGG-19 and decoder)
FEDDG_BENCHMARK_STUBS = ("torchvision", "wandb", "wilds", "termcolor", "src.adain_net")


@contextlib.contextmanager
def feddg_benchmark_imports(*extra: str) -> Iterator[None]:
    """While the block runs, the training stack of PARDON-FedDG's (or inouye-lab/FedDG_Benchmark's)
    ``src/server.py`` and ``src/client.py`` imports without being there: :data:`FEDDG_BENCHMARK_STUBS` and
    ``extra`` (the benchmark's ``transformers``, ``torch_scatter``) are stub modules (:func:`stub_modules`), and
    ``torch.load`` returns an empty dict (``src/server.py:29-30`` and ``src/client.py:34-35`` load
    ``src/models/*.pth`` at module level, files not in the repository). Use it inside :func:`importable` of the
    checkout, which forgets the checkout's ``src`` package after."""
    with stub_modules(FEDDG_BENCHMARK_STUBS + extra), patched(torch, load=lambda *args, **kwargs: {}):
        yield


def load_functions(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """Compiles and runs only the definitions ``names`` of the file ``path`` in ``namespace`` (their globals;
    the file's other code, which may run a whole pipeline at import, is not run); returns the namespace."""
    path = Path(path)
    tree = ast.parse(path.read_text(), str(path))
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {n.name for n in nodes}
    if missing:
        raise SystemExit(f"error: {path} defines none of {sorted(missing)}: not the pinned commit?")
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def load_loop(path: Path, target: str) -> types.CodeType:
    """The one ``for {target} in ...:`` loop of the file ``path`` (``target`` as written: ``"i_batch,
    sampled_batch"``), compiled alone with the file's name and line numbers (tracebacks point into it): for code
    the authors wrote inline, in a script's ``__main__`` block, rather than in a function. The loop is cut from
    the text by indentation, not from the file's syntax tree, so a syntax error elsewhere in the file does not
    stop it. ``exec`` it in a namespace holding its free names."""
    path = Path(path)
    lines = path.read_text().splitlines()
    heads = [i for i, line in enumerate(lines) if line.lstrip().startswith(f"for {target} in ")]
    if len(heads) != 1:
        raise SystemExit(f"error: {path} has {len(heads)} loops over {target!r}, not 1: not the pinned commit?")
    head = heads[0]
    indent = len(lines[head]) - len(lines[head].lstrip())
    end = head + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    tree = ast.parse(textwrap.dedent("\n".join(lines[head:end])), str(path))
    ast.increment_lineno(tree, head)
    return compile(tree, str(path), "exec")


def recorder(function: Callable, keep: Callable | None = None, into: list | None = None) -> Callable:
    """``function``, wrapped to keep what each call gave: ``keep(result, *args, **kwargs)`` (the call's result
    and arguments; default: the result itself) is appended to the wrapper's ``values`` (the list ``into`` when
    given, so several recorders can keep their order in one list). The wrapper is a plain function, so it also
    stands in for a method (``keep`` then receives ``self`` as the first argument after the result)."""
    values = [] if into is None else into

    def wrapper(*args, **kwargs):
        result = function(*args, **kwargs)
        values.append(result if keep is None else keep(result, *args, **kwargs))
        return result

    wrapper.values = values
    return wrapper


@contextlib.contextmanager
def recording(owner: Any, name: str, keep: Callable | None = None, into: list | None = None) -> Iterator[list]:
    """``owner.<name>`` replaced by its :func:`recorder` while the block runs (:func:`patched`); yields the list
    of what the calls kept."""
    wrapper = recorder(getattr(owner, name), keep, into)
    with patched(owner, **{name: wrapper}):
        yield wrapper.values


def detached(result: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """A ``keep`` for :func:`recorder`: a detached copy of the result (a draw, a loss)."""
    return result.detach().clone()


@contextlib.contextmanager
def backward_calls() -> Iterator[list]:
    """Records (detached copies of) the tensors ``.backward()`` is called on while the block runs: the loss
    the authors' training step optimises, whatever it adds up inside."""
    with recording(torch.Tensor, "backward", lambda result, tensor, *args, **kwargs: tensor.detach().clone()) as seen:
        yield seen


class FixedDraws:
    """Stands in for a random-number module inside the authors' code (their ``random``, or ``np.random``, by
    replacing the module's global): each draw named in ``script`` returns its next scripted value, whatever
    its arguments; ``FixedDraws(random=[0.3, 0.8])``. ``left(name)`` is what was not drawn (an error when the
    code draws more than scripted)."""

    def __init__(self, **script: Iterable):
        self._script = {name: list(values) for name, values in script.items()}

    def __getattr__(self, name):
        script = self.__dict__.get("_script", {})
        if name not in script:
            raise AttributeError(name)
        return lambda *args, **kwargs: script[name].pop(0)

    def left(self, name: str) -> list:
        return self._script[name]


# -- models both sides build ---------------------------------------------------------------------
class UnusedBlock(nn.Module):
    """Stub for torchvision's ``BasicBlock`` / ``Bottleneck`` in the authors' ResNet files: ``ResNet._make_layer``
    builds it; the layers are then replaced (:func:`reduced_layer4`)."""

    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()


#: ``torchvision.models.resnet`` as the authors' ResNet files import it (``BasicBlock``, ``Bottleneck``,
#: ``model_urls``), for :func:`stub_modules`'s ``attrs``
TORCHVISION_RESNET_STUBS = {"torchvision": {}, "torchvision.models": {},
                            "torchvision.models.resnet": {"BasicBlock": UnusedBlock, "Bottleneck": UnusedBlock,
                                                          "model_urls": {}}}


def reduced_layer4() -> nn.Module:
    """What replaces an authors' ResNet's ``layer4`` (``layer1``-``layer3`` being identities) on both sides, so
    that small images give the 7 x 7 maps of 512 channels their code needs: one 3 x 3 convolution 64 -> 512
    (no bias) and a ReLU."""
    return nn.Sequential(nn.Conv2d(64, 512, 3, padding=1, bias=False), nn.ReLU())


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
