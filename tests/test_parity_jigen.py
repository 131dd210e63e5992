"""Parity of JiGen's ``reference_code`` mode with the authors' jigsaw loader and training step
(fmcarlucci/JigenDG ``data/JigsawLoader.py``, ``train_jigsaw.py``; fixture: ``python -m parity.jigen``, see its
docstring)."""

from __future__ import annotations

import pytest
import torch

from fedstyle.algorithms import jigen
from fedstyle.models.base import Classifier
from parity import jigen as generator
from parity.common import read_fixture

from parity_steps import Renaming, checked_settings, compare_step, replayed_step, seeded_model, small_resnet

FIXTURE = read_fixture("jigen")
#: measured: shuffled batch and classes equal; logits <= 3.5e-7, losses <= 1.4e-7, gradients <= 1.3e-6
OUT_TOL, LOSS_TOL, GRAD_TOL = 1e-5, 1e-5, 1e-4
#: the relative errors the last run measured (for docs/parity.md)
MEASURED: dict[str, float] = {}
NAMES = Renaming({"class_classifier.": "head.", "jigsaw_classifier.": "jigsaw_head."})  # else under backbone.


def _authors_perms() -> torch.Tensor:
    """The authors' permutation file (not reproduced: see the docstring) as fedstyle's table: identity first."""
    return torch.cat([torch.arange(9)[None], FIXTURE["permutations"]])


def _algo(monkeypatch, classify: str) -> jigen.JiGen:
    # the authors' set instead of fedstyle's greedy one (which also saves its one-second search here)
    monkeypatch.setattr(jigen, "jigsaw_permutations", lambda count, seed: _authors_perms())
    return jigen.JiGen({"reference_code": True, "classify": classify, "bias_whole_image": generator.BIAS,
                        "jig_weight": generator.JIG_WEIGHT, "permutations": generator.PERMUTATIONS},
                       num_classes=generator.CLASSES, num_clients=1)


def _replay_draws(monkeypatch):
    """The loader's draws (np.random.randint over 0..P, then random() against the bias) for fedstyle's
    reference draw (torch.randint over 0..P, then torch.rand against beta)."""
    batch, top = generator.BATCH, generator.PERMUTATIONS + 1

    def randint(low, high, size, **kwargs):
        assert (low, high, tuple(size)) == (0, top, (batch,))
        return FIXTURE["draw/class"].clone()

    def rand(*size, **kwargs):
        assert tuple(size) == (batch,)
        return FIXTURE["draw/uniform"].clone()

    monkeypatch.setattr(torch, "randint", randint)
    monkeypatch.setattr(torch, "rand", rand)


def _model(algo: jigen.JiGen) -> Classifier:
    model = small_resnet(generator.CLASSES, reduced=True)  # layer1-3 identities, layer4 one conv + ReLU
    algo.configure_model(model)
    seeded_model(model, NAMES.to_authors, FIXTURE)
    return model.train()


def test_fixture_provenance():
    settings = checked_settings(FIXTURE, generator)
    assert {k: v for k, v in settings.items() if k != "draw_seed"} == generator.SETTINGS


def test_reference_mode_settings():
    assert jigen.JiGen.resolve({"reference_code": True})["classify"] == "all"
    assert jigen.JiGen.resolve({"reference_code": True, "classify": "ordered"})["classify"] == "ordered"
    assert jigen.JiGen.resolve({})["classify"] == "ordered"


def test_reference_draw_and_tile_shuffle_match_the_authors_loader(monkeypatch):
    algo = _algo(monkeypatch, "all")
    _replay_draws(monkeypatch)
    shuffled, orders = algo.jigsaw_batch(generator.images())
    assert torch.equal(orders, FIXTURE["orders"])  # uniform class, then 0 where the bias draw says so
    assert torch.equal(shuffled, FIXTURE["shuffled"])  # the same pixels moved: exact
    assert 0 < int((orders == 0).sum()) < generator.BATCH


@pytest.mark.parametrize("classify", sorted(generator.CLASSIFY))
def test_training_loss_matches_the_authors_step(monkeypatch, classify):
    algo = _algo(monkeypatch, classify)
    model = _model(algo)
    _replay_draws(monkeypatch)
    step = replayed_step(monkeypatch, algo, model, generator.images(), torch.tensor(generator.LABELS),
                         hooks=("head", "jigsaw_head"))  # then torch.randint and torch.rand as they are

    sums = step.ctx._sums
    result = compare_step(FIXTURE, step, f"{classify}/", to_authors=NAMES.to_authors,
                          class_logits=step.outputs["head"][-1], jigsaw_logits=step.outputs["jigsaw_head"][-1],
                          class_loss=sums["jigen_ce"], jigsaw_loss=sums["jigen_jigsaw"])
    assert len(result.grads) == len(step.grads)  # every parameter
    MEASURED.update(result.measured(f"{classify}/"))
    result.assert_within(OUT_TOL, LOSS_TOL, GRAD_TOL)
