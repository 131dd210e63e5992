"""StableFDG's reference mode against the authors' code (fixture: parity/stablefdg.py).

One training step of ResNet-18 at 64 px, batch 32 + 32 oversampled, 7 classes, every piece on (shift to a
received style, k-means centres, oversampling, exploration at alpha = 3, MixStyle, the attention
highlighter), with the authors' random draws forced through :class:`PipelineDraws`: the loss must match
within 1e-5 relative and every parameter's gradient within 1e-3 relative (issue 34's bar).
"""

from __future__ import annotations

import pytest
import torch

from fedstyle.algorithms.stablefdg import STYLE_KEY, StableFDG
from fedstyle.algorithms.stablefdg_pipeline import PipelineDraws
from fedstyle.models import build_model
from parity import stablefdg as generator
from parity.common import read_fixture, seeded_weights

from parity_steps import assert_weight_sums, checked_settings, client_context, compare_step, placeholder_data, run_step
from tiny import SETTINGS, TRANSFORM

FIXTURE = read_fixture("stablefdg")
LOSS_TOL, GRAD_TOL = 1e-5, 1e-3


class ForcedDraws(PipelineDraws):
    """The draws the authors' code made in one scenario, handed out in the order fedstyle asks for them."""

    def __init__(self, scenario: str):
        super().__init__(mix_weights=None, reference=True)
        draws = FIXTURE.group(f"{scenario}/draw/")
        self.script = list(generator.SCENARIOS[scenario])
        self.lists = {kind: [draws[f"{kind}/{i}"] for i in range(sum(k.startswith(kind + "/") for k in draws))]
                      for kind in ("centres", "noise", "lam", "perm")}
        self.extra = draws["extra"]

    def fires(self, p):
        return self.script.pop(0) <= 0.5  # the authors' `random.random() > 0.5: skip`

    def normal(self, shape, like):
        noise = self.lists["noise"].pop(0)
        assert noise.numel() == torch.Size(shape).numel()
        return noise.view(shape).to(like)

    def kmeans(self, points, k):
        centres = self.lists["centres"].pop(0)
        assert centres.shape == (k, points.shape[1])
        return None, centres.to(points)

    def oversample(self, labels, count, num_classes, balanced):
        assert count == len(self.extra)
        return self.extra.to(labels.device)

    def mix_weights(self, batch, like):
        return self.lists["lam"].pop(0).view(batch, 1, 1, 1).to(like)

    def permutation(self, n, device):
        return self.lists["perm"].pop(0).to(device)

    def finished(self) -> bool:
        return not self.script and not any(self.lists.values())


def authors_names(model) -> dict[str, str]:
    """fedstyle's parameter name -> the fixture's (the authors' model: backbone names bare, the attention's
    query and key rows of cad3.qkv_conv, the classifier)."""
    names = {}
    for name, _ in model.named_parameters():
        if name.startswith("backbone."):
            names[name] = name[len("backbone."):]
        elif name.startswith("neck."):
            part, leaf = name[len("neck."):].split(".")
            names[name] = f"cad3.{part[0]}.{leaf}"  # query -> cad3.q, key -> cad3.k
        else:
            names[name] = name.replace("head.", "classifier.")
    return names


def reference_model():
    algo = StableFDG({"reference_code": True}, num_classes=generator.CLASSES, num_clients=4)
    model = build_model("resnet18", generator.CLASSES, generator.SIZE)
    algo.configure_model(model)
    # the authors' state: the same seeded tensors, named as in their model
    shapes = {k[len("backbone."):]: v.shape for k, v in model.state_dict().items() if k.startswith("backbone.")}
    shapes.update({"cad3.qkv_conv.weight": (90, 512, 1, 1), "cad3.qkv_conv.bias": (90,),
                   "cad3.attn_out.weight": (1, 1, 1, 1), "cad3.attn_out.bias": (1,),
                   "classifier.weight": (generator.CLASSES, 1024), "classifier.bias": (generator.CLASSES,)})
    theirs = seeded_weights(shapes)
    assert set(FIXTURE.group("weight_sum/")) == set(theirs)
    assert_weight_sums(theirs, FIXTURE)  # the same seeded weights, within float64 rounding
    mine = {k: theirs[k[len("backbone."):]] for k in model.state_dict() if k.startswith("backbone.")}
    qkv_w, qkv_b = theirs["cad3.qkv_conv.weight"], theirs["cad3.qkv_conv.bias"]
    mine.update({"neck.query.weight": qkv_w[:30], "neck.key.weight": qkv_w[30:60],
                 "neck.query.bias": qkv_b[:30], "neck.key.bias": qkv_b[30:60],
                 "head.weight": theirs["classifier.weight"], "head.bias": theirs["classifier.bias"]})
    model.load_state_dict(mine)
    return algo, model.train()


def reference_step(scenario: str):
    """One reference step of scenario ``scenario``: the Step and fedstyle's names -> the fixture's."""
    algo, model = reference_model()
    algo.draws = draws = ForcedDraws(scenario)
    x, y = generator.inputs()
    assert torch.equal(y, FIXTURE["labels"])
    mean, spread = FIXTURE["style/mean"], FIXTURE["style/spread"]
    phi = torch.stack([mean[:64], mean[64:], spread[:64] ** 2, spread[64:] ** 2])  # spread = sqrt(var)
    ctx = client_context(placeholder_data(torch.zeros(2, dtype=torch.long), 8, TRANSFORM), SETTINGS.train_settings(1),
                         round=1, num_clients=4)
    step = run_step(algo, model, x, y, {STYLE_KEY: phi}, ctx=ctx)
    assert draws.finished(), "fedstyle asked for other draws than the authors' code made"
    return step, authors_names(model)


def test_fixture_names_the_authors_repository_and_commit():
    assert checked_settings(FIXTURE, generator)["labels"] == generator.LABELS


@pytest.mark.parametrize("scenario", sorted(generator.SCENARIOS))
def test_one_reference_step_matches_the_authors_loss_and_every_gradient(scenario):
    step, names = reference_step(scenario)
    assert step.ctx.logged_metrics()["shift_fired"] == (1.0 if scenario == "a" else 0.0)
    result = compare_step(FIXTURE, step, f"{scenario}/", to_authors=names, logits=step.outputs["head"][0])
    assert result.errors["logits"] < 1e-4
    assert result.errors["loss"] < LOSS_TOL, (float(step.loss), float(FIXTURE[f"{scenario}/loss"]))
    worst, error = result.worst_grad
    assert error < GRAD_TOL, f"{worst}: {error:.2e} (top: {sorted(result.grads.items(), key=lambda e: -e[1])[:4]})"
