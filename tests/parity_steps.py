"""What the parity tests (``tests/test_parity_<method>.py``) share (not collected; see parity/common.py for what
generators and tests share).

* the fixture: :func:`parity_fixture` (the module-scoped pytest fixture ``fixture``), :func:`checked_settings`
  (the fixture names the generator's repository and commit);
* the authors' weights: :func:`assert_weight_sums`, :func:`load_authors_state` (a generator's state, checked
  and loaded under fedstyle's names), :func:`seeded_model` (the seeded state rebuilt by the authors' names,
  checked, loaded), :class:`Renaming` (fedstyle's names -> the authors') and :func:`small_resnet`
  (the ResNet(1, 1, 1, 1) of the MixStyle, DSU, JiGen and RSC fixtures, optionally reduced as the generators do);
* one step: :func:`client_context` and :func:`placeholder_data`, :func:`run_step` (``training_loss`` and
  ``backward``, chosen modules' outputs kept, :func:`outputs_of`; :func:`replayed_step` with the authors' draws
  replayed) and :func:`compare_step` (their relative errors and every gradient's against the fixture: a
  :class:`StepResult`). Tolerances stay in the tests.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import pytest
import torch
from torch import nn

from fedstyle.algorithms.context import ClientContext, TrainSettings
from fedstyle.data.client import ClientData
from fedstyle.models.base import Classifier
from fedstyle.models.resnet import BasicBlock, ResNet
from parity.common import (Fixture, gradient_errors, read_fixture, reduced_layer4, relative_error, seeded_weights,
                           weight_sums)

CPU = torch.device("cpu")
Names = Callable[[str], str] | Mapping[str, str]


# -- the fixture ---------------------------------------------------------------------------------
def parity_fixture(name: str):
    """The module-scoped pytest fixture ``fixture``, ``name``'s parity fixture: ``fixture = parity_fixture("ccst")``."""
    def fixture() -> Fixture:
        return read_fixture(name)

    return pytest.fixture(scope="module", name="fixture")(fixture)


def checked_settings(fixture: Fixture, generator, second: str | None = None) -> dict:
    """Asserts that ``fixture`` names ``generator``'s repository and commit (with ``second="pardon"``, also the
    second checkout's: settings ``pardon_repository`` / ``pardon_commit`` are ``generator.PARDON_REPOSITORY`` /
    ``PARDON_COMMIT``); returns the fixture's settings."""
    assert fixture.meta["repository"] == generator.REPOSITORY
    assert fixture.meta["commit"] == generator.COMMIT
    settings = fixture.settings
    if second is not None:
        assert settings[f"{second}_repository"] == getattr(generator, f"{second.upper()}_REPOSITORY")
        assert settings[f"{second}_commit"] == getattr(generator, f"{second.upper()}_COMMIT")
    return settings


# -- the authors' weights ------------------------------------------------------------------------
def _function(names: Names) -> Callable[[str], str]:
    return names.__getitem__ if isinstance(names, Mapping) else names


@dataclass(frozen=True)
class Renaming:
    """fedstyle's tensor names -> the authors' (:meth:`to_authors`): ``heads`` maps the authors' prefixes of the
    classifier heads to fedstyle's (``{"class_classifier.": "head."}``); every other tensor is the authors' name
    under ``trunk``."""

    heads: Mapping[str, str]
    trunk: str = "backbone."

    def to_authors(self, name: str) -> str:
        for theirs, ours in self.heads.items():
            if name.startswith(ours):
                return theirs + name[len(ours):]
        return name[len(self.trunk):]


#: a float64 sum of float32 weights is exact only up to its order of additions, and that order depends on the thread
#: count and the vector width (AVX2 vs AVX-512): its error is at most (n - 1) 2^-53 sum|w| and in practice about
#: sqrt(n) 2^-53 sum|w| (2e-13 sum|w| for ResNet-18's largest tensor). Rebuilt weights match when the sums agree
#: within 1e-12 sum|w|; a different draw moves the sum by about sum|w| / sqrt(n), more than 1e-4 sum|w| here.
WEIGHT_SUM_TOLERANCE = 1e-12


def assert_weight_sums(state: Mapping[str, torch.Tensor], fixture: Fixture, prefix: str = "weight_sum/",
                       approx: float | None = None) -> None:
    """Every tensor's float64 sum equals the fixture's ``{prefix}{name}`` within :data:`WEIGHT_SUM_TOLERANCE` of
    the sum of its magnitudes (never bitwise: see there), or within ``approx`` relative / absolute when that is
    looser."""
    for key, value in weight_sums(state, prefix).items():
        magnitude = float(state[key[len(prefix):]].detach().double().abs().sum())
        bound = max(WEIGHT_SUM_TOLERANCE * magnitude, (approx or 0.0) * max(1.0, abs(float(fixture[key]))))
        assert abs(float(value) - float(fixture[key])) <= bound, (key, float(value), float(fixture[key]))


def load_authors_state(model: nn.Module, state: Mapping[str, torch.Tensor], fixture: Fixture,
                       to_fedstyle: Names | None = None, *, prefix: str = "weight_sum/",
                       approx: float | None = None) -> None:
    """``state`` (the authors' names) checked against the fixture's sums (:func:`assert_weight_sums`) and loaded
    into ``model`` (strict) under ``to_fedstyle``'s names (the same names when None)."""
    assert_weight_sums(state, fixture, prefix, approx)
    rename = (lambda name: name) if to_fedstyle is None else _function(to_fedstyle)
    model.load_state_dict({rename(k): v for k, v in state.items()})


def seeded_model(model: nn.Module, to_authors: Names, fixture: Fixture, prefix: str = "weight_sum/", seed: int = 0,
                 overrides: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Loads into ``model`` the generator's seeded weights (:func:`seeded_weights` keyed by the authors' names,
    ``to_authors`` of each of the model's tensors; a mapping must name every one of them, checked), ``overrides``
    (by the authors' names) replacing some, after checking every sum against the fixture's ``{prefix}{name}``.
    Returns the authors' state."""
    ours = model.state_dict()
    if isinstance(to_authors, Mapping):
        assert set(to_authors) == set(ours)  # every tensor of fedstyle's model set
    rename = _function(to_authors)
    names = {k: rename(k) for k in ours}
    state = seeded_weights({names[k]: v.shape for k, v in ours.items()}, seed=seed)
    state.update(overrides or {})
    load_authors_state(model, state, fixture, {a: k for k, a in names.items()}, prefix=prefix)
    return state


def small_resnet(classes: int, reduced: bool = False) -> Classifier:
    """fedstyle's ResNet with one BasicBlock a stage and a linear head; ``reduced``: the generators' replacement
    (layer1-3 identities, layer4 one conv + ReLU, :func:`parity.common.reduced_layer4`)."""
    backbone = ResNet(BasicBlock, (1, 1, 1, 1))
    if reduced:
        backbone.layer1 = backbone.layer2 = backbone.layer3 = nn.Identity()
        backbone.layer4 = reduced_layer4()
    return Classifier(backbone, classes)


# -- one step ------------------------------------------------------------------------------------
def as_float(images: torch.Tensor, train: bool = True) -> torch.Tensor:
    return images.float()


def placeholder_data(labels: torch.Tensor, size: int, transform: Callable = as_float) -> ClientData:
    """Black uint8 images (3 x size x size, domain 0), one a label: a client whose batches the test hands in."""
    return ClientData(torch.zeros(len(labels), 3, size, size, dtype=torch.uint8), labels, torch.zeros_like(labels),
                      transform)


def client_context(data: ClientData | None = None, train: TrainSettings | None = None, *, round: int = 0,
                   num_clients: int = 1) -> ClientContext:
    """Client 0's context on the CPU, seed 0, empty state."""
    return ClientContext(client_id=0, data=data, state={}, train=train, round=round, num_clients=num_clients,
                         device=CPU, seed=0)


@contextlib.contextmanager
def outputs_of(module: nn.Module, clone: bool = True) -> Iterator[list[torch.Tensor]]:
    """What ``module`` returns while the block runs, call by call (detached; cloned unless ``clone=False``)."""
    kept: list[torch.Tensor] = []

    def keep(module, args, out):
        kept.append(out.detach().clone() if clone else out.detach())  # returns None: the output stays as it is

    handle = module.register_forward_hook(keep)
    try:
        yield kept
    finally:
        handle.remove()


@dataclass
class Step:
    """One ``training_loss`` and its ``backward``: the loss (detached), the outputs of the hooked modules (by
    attribute name, call by call), every parameter's gradient (fedstyle's names) and the context it ran in."""

    loss: torch.Tensor
    outputs: dict[str, list[torch.Tensor]]
    grads: dict[str, torch.Tensor]
    ctx: Any


def run_step(algo, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, payload: dict | None = None, *,
             ctx: Any = None, hooks: tuple[str, ...] = ("head",)) -> Step:
    """``algo.training_loss(ctx, model, images, labels, payload)`` (ctx: :func:`client_context` when None, payload
    ``{}``) and its ``backward``, the outputs of ``model``'s modules named in ``hooks`` kept."""
    ctx = client_context() if ctx is None else ctx
    with contextlib.ExitStack() as stack:
        outputs = {name: stack.enter_context(outputs_of(getattr(model, name), clone=False)) for name in hooks}
        loss = algo.training_loss(ctx, model, images, labels, {} if payload is None else payload)
        loss.backward()
    return Step(loss.detach(), outputs, {k: p.grad for k, p in model.named_parameters()}, ctx)


def replayed_step(monkeypatch, algo, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *,
                  left: tuple[list, ...] = (), **kwargs) -> Step:
    """:func:`run_step` while ``monkeypatch`` hands fedstyle the authors' recorded draws; then every list in ``left``
    (the draws not handed out yet) must be empty, every recorded draw used, in order, and the patches are undone:
    torch's samplers as they are again (the gradient sketches draw with them)."""
    step = run_step(algo, model, images, labels, **kwargs)
    assert all(not rest for rest in left)  # every recorded draw used, in order
    monkeypatch.undo()
    return step


@dataclass
class StepResult:
    """Relative errors against a fixture: ``errors`` per compared tensor, ``grads`` per parameter (the fixture's
    names)."""

    errors: dict[str, float]
    grads: dict[str, float]

    @property
    def grad(self) -> float:
        return max(self.grads.values())

    @property
    def worst_grad(self) -> tuple[str, float]:
        return max(self.grads.items(), key=lambda kv: kv[1])

    def measured(self, prefix: str) -> dict[str, float]:
        """The errors as a test's ``MEASURED`` keeps them: ``{prefix}{name}`` and ``{prefix}grad`` (the largest)."""
        return {**{prefix + k: v for k, v in self.errors.items()}, prefix + "grad": self.grad}

    def assert_within(self, out_tol: float, loss_tol: float, grad_tol: float) -> None:
        """Every ``*logits`` error <= ``out_tol``, every ``*loss`` error <= ``loss_tol``, every gradient's
        <= ``grad_tol``."""
        assert max(v for k, v in self.errors.items() if k.endswith("logits")) <= out_tol, self.errors
        assert max(v for k, v in self.errors.items() if k.endswith("loss")) <= loss_tol, self.errors
        assert self.grad <= grad_tol, self.worst_grad


def relative_errors(fixture: Fixture, prefix: str, **tensors: torch.Tensor) -> dict[str, float]:
    """``{name: relative_error(tensor, fixture[prefix + name])}``."""
    return {name: relative_error(tensor, fixture[prefix + name]) for name, tensor in tensors.items()}


def compare_step(fixture: Fixture, step: Step, prefix: str = "", *, to_authors: Names | None = None,
                 loss: str = "loss", grad_prefix: str | None = None, **tensors: torch.Tensor) -> StepResult:
    """``step`` against the fixture: each of ``tensors`` against ``{prefix}{name}``, the step's loss against
    ``{prefix}{loss}`` (in that order), every gradient (renamed by ``to_authors``) against the fixture's record under
    ``grad_prefix`` (default ``{prefix}grad/``; :func:`gradient_errors`: none missing on either side)."""
    errors = relative_errors(fixture, prefix, **tensors, **{loss: step.loss})
    rename = (lambda name: name) if to_authors is None else _function(to_authors)
    grads = gradient_errors(fixture.tensors, {rename(k): g for k, g in step.grads.items()},
                            prefix=prefix + "grad/" if grad_prefix is None else grad_prefix)
    return StepResult(errors, grads)
