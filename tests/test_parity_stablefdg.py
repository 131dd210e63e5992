"""StableFDG's reference mode against the authors' code (fixture: parity/stablefdg.py), in float64.

One training step of ResNet-18 at 64 px, batch 32 + 32 oversampled, 7 classes, every piece on (shift to a
received style with negative sigma' draws, k-means centres, oversampling, exploration at alpha = 3, MixStyle,
the attention highlighter), with the authors' random draws forced through :class:`PipelineDraws`; fedstyle's own
code computes what is compared: its k-means (scikit-learn, the authors' seed) on its own [mu, sigma] points, its
level-by-level oversampling order, its shift, its step; then its Phi of one batch and two rounds of its server's
pairing.

Both sides run in float64 (issue 49): in float32 the step's BatchNorm-bias gradients, sums that nearly cancel,
differ by 1.4e-4 on an AVX2 CPU and 1.2e-3 on an AVX-512 one, so a float32 bar cannot be both tight and portable.
In float64 the loss must match within 1e-10 relative and every gradient within 1e-5 (the gradients are stored as
float32 sketches: 6e-8 is their rounding), whatever the CPU or thread count.
"""

from __future__ import annotations

import pytest
import torch

from fedstyle.algorithms.context import ServerContext
from fedstyle.algorithms.stablefdg import STYLE_KEY, StableFDG
from fedstyle.algorithms.stablefdg_pipeline import PipelineDraws
from fedstyle.data.client import ClientData
from fedstyle.models import build_model
from fedstyle.style.selection import sklearn_kmeans_centres
from parity import stablefdg as generator
from parity.common import patched, read_fixture, relative_error, seeded_weights

from parity_steps import assert_weight_sums, checked_settings, client_context, compare_step, placeholder_data, run_step
from tiny import SETTINGS, TRANSFORM

FIXTURE = read_fixture("stablefdg")
DTYPE = generator.DTYPE
#: float64 against float64: the step's loss and logits agree to about 1e-15, the gradients to the float32
#: rounding of their stored sketches
LOSS_TOL, LOGITS_TOL, GRAD_TOL = 1e-10, 1e-10, 1e-5
#: the k-means points, the shifted maps' statistics: float64 sums of a few hundred terms
STATS_TOL = 1e-10
#: Phi: fedstyle returns it in float32 (its payload type)
PHI_TOL = 1e-6


class ForcedDraws(PipelineDraws):
    """The draws the authors' code made in one scenario, handed out in the order fedstyle asks for them; k-means and
    the oversampling order are fedstyle's own code, run on fedstyle's inputs with the authors' draws."""

    def __init__(self, scenario: str):
        super().__init__(mix_weights=None, reference=True)
        draws = FIXTURE.group(f"{scenario}/draw/")
        self.script = list(generator.SCENARIOS[scenario])
        self.lists = {kind: [draws[f"{kind}/{i}"] for i in range(sum(k.startswith(kind + "/") for k in draws))]
                      for kind in ("centres", "kmeans_input", "noise", "lam", "perm", "level_order", "member")}
        self.extra = draws["extra"]

    def fires(self, p):
        return self.script.pop(0) <= 0.5  # the authors' `random.random() > 0.5: skip`

    def normal(self, shape, like):
        noise = self.lists["noise"].pop(0)
        assert noise.numel() == torch.Size(shape).numel()
        return noise.view(shape).to(like)

    def kmeans(self, points, k):
        # fedstyle's points ([mu, sigma] of each sample) are the authors' k-means input ...
        theirs = self.lists["kmeans_input"].pop(0)
        assert points.shape == theirs.shape and relative_error(points, theirs) < STATS_TOL, "k-means input differs"
        # ... and fedstyle's k-means (scikit-learn, seeded as the generator seeded the authors') gives their centres,
        # so the same assignment of the samples to the centres
        centres = sklearn_kmeans_centres(points, k, generator.KMEANS_SEED)
        assert relative_error(centres, self.lists["centres"].pop(0)) < STATS_TOL, "k-means centres differ"
        return None, centres

    def oversample(self, labels, count, num_classes, balanced):
        """fedstyle's level-by-level order (level_order_indices) with the authors' draws: each level's classes in
        the order their np.random.choice drew (positions among the level's classes) and each extra's member."""
        levels, members = self.lists["level_order"], self.lists["member"]

        def randperm(n, *args, **kwargs):
            drawn = levels.pop(0).tolist()  # the last level: only the classes it took
            assert len(drawn) <= n
            return torch.tensor(drawn + [p for p in range(n) if p not in drawn])

        def randint(high, size, *args, **kwargs):
            member = members.pop(0)
            assert int(member) < high
            return member.view(size)

        with patched(torch, randperm=randperm, randint=randint):
            extra = super().oversample(labels, count, num_classes, balanced)
        assert torch.equal(extra, self.extra.to(extra.device)), "the oversampled rows differ from the authors'"
        return extra

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
    return algo, model.to(DTYPE).train()


def reference_step(scenario: str, monkeypatch):
    """One reference step of scenario ``scenario`` in float64: the Step, fedstyle's names -> the fixture's, and the
    shifted maps' statistics (mean and deviation over H x W per sample and channel)."""
    algo, model = reference_model()
    algo.draws = draws = ForcedDraws(scenario)
    shifted = []
    from fedstyle.algorithms import stablefdg_pipeline

    def shift(*args, **kwargs):
        out = selective_shift(*args, **kwargs)
        shifted.append(torch.stack([out.mean((2, 3)), out.std((2, 3))]).detach())
        return out

    selective_shift = stablefdg_pipeline.selective_shift
    monkeypatch.setattr(stablefdg_pipeline, "selective_shift", shift)
    x, y = generator.inputs()
    assert torch.equal(y, FIXTURE["labels"])
    mean, spread = FIXTURE["style/mean"].to(DTYPE), FIXTURE["style/spread"].to(DTYPE)
    phi = torch.stack([mean[:64], mean[64:], spread[:64] ** 2, spread[64:] ** 2])  # spread = sqrt(var)
    ctx = client_context(placeholder_data(torch.zeros(2, dtype=torch.long), 8, TRANSFORM), SETTINGS.train_settings(1),
                         round=1, num_clients=4)
    with generator.default_dtype(DTYPE):
        step = run_step(algo, model, x.to(DTYPE), y, {STYLE_KEY: phi}, ctx=ctx)
    assert draws.finished(), "fedstyle asked for other draws than the authors' code made"
    return step, authors_names(model), shifted


def test_fixture_names_the_authors_repository_and_commit():
    settings = checked_settings(FIXTURE, generator)
    assert settings["labels"] == generator.LABELS and settings["dtype"] == "float64"
    assert settings["participants"] == generator.PARTICIPANTS


@pytest.mark.parametrize("scenario", sorted(generator.SCENARIOS))
def test_one_reference_step_matches_the_authors_loss_and_every_gradient(scenario, monkeypatch):
    step, names, shifted = reference_step(scenario, monkeypatch)
    assert step.ctx.logged_metrics()["shift_fired"] == (1.0 if scenario == "a" else 0.0)
    result = compare_step(FIXTURE, step, f"{scenario}/", to_authors=names, logits=step.outputs["head"][0])
    assert result.errors["logits"] < LOGITS_TOL, result.errors
    assert result.errors["loss"] < LOSS_TOL, (float(step.loss), float(FIXTURE[f"{scenario}/loss"]))
    worst, error = result.worst_grad
    assert error < GRAD_TOL, f"{worst}: {error:.2e} (top: {sorted(result.grads.items(), key=lambda e: -e[1])[:4]})"
    theirs = FIXTURE.group(f"{scenario}/draw/shifted/")
    assert len(shifted) == len(theirs)
    for i, stats in enumerate(shifted):
        # where a draw of sigma' is negative the authors' channel is flat (sigma' clamped at 0: deviation 0)
        assert float((stats - theirs[str(i)]).abs().max()) < STATS_TOL, "the shifted maps differ"


def test_the_step_has_negative_sigma_draws_that_flatten_their_channels():
    """The fixture exercises the clamp: some of the authors' shifted channels are flat (sigma' <= 0 -> 0)."""
    deviation = FIXTURE["a/draw/shifted/0"][1]
    flat = deviation[generator.BATCH // 2:] == 0  # the drawn half
    assert int(flat.sum()) >= 5
    assert set(flat.nonzero()[:, 1].tolist()) <= set(generator.LOW_SIGMA_CHANNELS)


def test_phi_of_one_batch_matches_the_authors_style_collect():
    """round_query's Phi (the reference mode: 1/(N-1) variances over the samples, spread sqrt(var + 1e-6), from a
    training batch) against style_collect (trainer.py:676-722) on the same batch and weights."""
    algo, model = reference_model()
    images = generator.phi_inputs().to(DTYPE)
    labels = torch.zeros(len(images), dtype=torch.long)
    data = ClientData(images, labels, labels.clone(), lambda batch, train=True, generator=None: batch)
    ctx = client_context(data, SETTINGS.train_settings(len(images)), round=1, num_clients=4)
    ctx.train.batch_size = len(images) if ctx.train.batch_size != len(images) else ctx.train.batch_size
    with generator.default_dtype(DTYPE):
        phi = algo.round_query(ctx, model)[STYLE_KEY]
    mine = torch.cat([phi[0], phi[1]]), torch.cat([phi[2], phi[3]]).sqrt()
    assert relative_error(mine[0], FIXTURE["phi/mean"]) < PHI_TOL
    assert relative_error(mine[1], FIXTURE["phi/spread"]) < PHI_TOL


@pytest.mark.parametrize("round", [0, 1])
def test_server_pairing_matches_the_authors_loop(round):
    """Two rounds of round_payloads (the greedy pairing) with the authors' draws: round 0 a derangement, round 1
    the last participant's own style (the code's failed pass)."""
    algo = StableFDG({"reference_code": True}, num_classes=generator.CLASSES, num_clients=30)
    draws, free = FIXTURE[f"pairing/{round}/draw"].tolist(), FIXTURE[f"pairing/{round}/free"].tolist()

    def randint(high, size, *args, **kwargs):
        assert high == free.pop(0), "the pairing draws among other participants than the authors' loop"
        return torch.tensor(draws.pop(0)).view(size)

    queries = {c: {STYLE_KEY: torch.tensor([c])} for c in generator.PARTICIPANTS}
    server = ServerContext(weights={}, state={}, round=round + 1, num_clients=30, seed=0)
    with patched(torch, randint=randint):
        payloads = algo.round_payloads(server, list(generator.PARTICIPANTS), queries)
    assert not draws and not free  # every draw of the authors' loop used
    received = [int(payloads[c][STYLE_KEY]) for c in generator.PARTICIPANTS]
    assert received == [generator.PARTICIPANTS[p] for p in FIXTURE[f"pairing/{round}/perm"].tolist()]
    assert (received[-1] == generator.PARTICIPANTS[-1]) == (round == 1)
