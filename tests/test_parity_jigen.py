"""Parity of JiGen's ``reference_code`` mode with the authors' jigsaw loader and training step
(fmcarlucci/JigenDG ``data/JigsawLoader.py``, ``train_jigsaw.py``; fixture: ``python -m parity.jigen``, see its
docstring)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedstyle.algorithms import jigen
from fedstyle.algorithms.context import ClientContext
from fedstyle.models.base import Classifier
from fedstyle.models.resnet import BasicBlock, ResNet
from parity import jigen as generator
from parity.common import gradient_errors, read_fixture, relative_error, seeded_weights, weight_sums

FIXTURE = read_fixture("jigen")
#: measured: shuffled batch and classes equal; logits <= 3.5e-7, losses <= 1.4e-7, gradients <= 1.3e-6
OUT_TOL, LOSS_TOL, GRAD_TOL = 1e-5, 1e-5, 1e-4
#: the relative errors the last run measured (for docs/parity.md)
MEASURED: dict[str, float] = {}
NAMES = {"class_classifier.": "head.", "jigsaw_classifier.": "jigsaw_head."}  # else under backbone.


def _fedstyle_name(authors: str) -> str:
    for theirs, ours in NAMES.items():
        if authors.startswith(theirs):
            return ours + authors[len(theirs):]
    return "backbone." + authors


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
    backbone = ResNet(BasicBlock, (1, 1, 1, 1))
    backbone.layer1 = backbone.layer2 = backbone.layer3 = nn.Identity()
    backbone.layer4 = generator.reduced_layer4()
    model = Classifier(backbone, generator.CLASSES)
    algo.configure_model(model)
    ours = {v: k for k, v in NAMES.items()}
    authors = {}
    for key, value in model.state_dict().items():
        prefix = key.split(".")[0] + "."
        authors[ours[prefix] + key[len(prefix):] if prefix in ours else key[len("backbone."):]] = value.shape
    state = seeded_weights(authors, seed=0)
    for key, value in weight_sums(state).items():
        assert torch.equal(value, FIXTURE[key]), key
    model.load_state_dict({_fedstyle_name(k): v for k, v in state.items()}, strict=True)
    return model.train()


def test_fixture_provenance():
    assert FIXTURE.meta["repository"] == generator.REPOSITORY and FIXTURE.meta["commit"] == generator.COMMIT
    assert {k: v for k, v in FIXTURE.settings.items() if k != "draw_seed"} == generator.SETTINGS


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
    logits = {}

    def keep(name):
        def hook(module, args, out):
            logits[name] = out.detach()  # returns None: the output stays as it is
        return hook

    model.head.register_forward_hook(keep("class"))
    model.jigsaw_head.register_forward_hook(keep("jigsaw"))
    ctx = ClientContext(client_id=0, data=None, state={}, train=None, round=0, num_clients=1,
                        device=torch.device("cpu"), seed=0)
    images = generator.images()
    loss = algo.training_loss(ctx, model, images, torch.tensor(generator.LABELS), {})
    loss.backward()
    monkeypatch.undo()  # torch.randint and torch.rand as they are (the gradient sketch draws with them)

    errors = {
        "class_logits": relative_error(logits["class"], FIXTURE[f"{classify}/class_logits"]),
        "jigsaw_logits": relative_error(logits["jigsaw"], FIXTURE[f"{classify}/jigsaw_logits"]),
        "class_loss": relative_error(ctx._sums["jigen_ce"].reshape(1), FIXTURE[f"{classify}/class_loss"]),
        "jigsaw_loss": relative_error(ctx._sums["jigen_jigsaw"].reshape(1), FIXTURE[f"{classify}/jigsaw_loss"]),
        "loss": relative_error(loss.detach().reshape(1), FIXTURE[f"{classify}/loss"]),
    }
    MEASURED.update({f"{classify}/{k}": v for k, v in errors.items()})
    assert max(v for k, v in errors.items() if k.endswith("logits")) <= OUT_TOL, errors
    assert max(v for k, v in errors.items() if k.endswith("loss")) <= LOSS_TOL, errors

    grads = {k: p.grad for k, p in model.named_parameters()}
    authors = {k.split("#")[0][len(f"{classify}/grad/"):] for k in FIXTURE.tensors if k.startswith(f"{classify}/grad/")}
    grad_errors = gradient_errors(FIXTURE.tensors, {a: grads[_fedstyle_name(a)] for a in authors},
                                  prefix=f"{classify}/grad/")
    assert len(grad_errors) == len(grads)  # every parameter
    MEASURED[f"{classify}/grad"] = max(grad_errors.values())
    assert MEASURED[f"{classify}/grad"] <= GRAD_TOL, max(grad_errors.items(), key=lambda kv: kv[1])
