"""Settings of the pretrained track: BatchNorm modes for fine-tuning, a fixed per-class subset of a dataset."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from fedstyle.errors import ConfigError
from fedstyle.experiments.build import load_config_dataset
from fedstyle.experiments.runner import run_experiment
from fedstyle.models import build_model

from conftest import TINY_PER_CLASS  # tests/conftest.py


def _bn_layers(model):
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _step(model, x, y):
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.1)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


@pytest.mark.parametrize("backbone", ["convnet", "efficientnet_lite0"])
def test_batchnorm_modes_keep_or_update_running_statistics_and_weights(backbone):
    torch.manual_seed(0)
    x, y = torch.randn(8, 3, 32, 32) * 3 + 1, torch.arange(8) % 4
    before = {}
    after = {}
    for mode in ("train", "eval", "frozen"):
        torch.manual_seed(0)
        # EfficientNet-Lite0 pretrained: its random init under ReLU6 saturates without batch statistics
        model = build_model(backbone, 4, 32, pretrained=backbone == "efficientnet_lite0")
        model.set_batchnorm(mode)
        bn = _bn_layers(model)
        before[mode] = [(b.running_mean.clone(), b.weight.detach().clone()) for b in bn]
        _step(model, x, y)
        after[mode] = [(b.running_mean.clone(), b.weight.detach().clone()) for b in bn]
        # train() keeps BatchNorm in eval under eval / frozen; the rest of the model trains
        assert model.training and all(b.training == (mode == "train") for b in bn)
        assert model.head.training
    moved_stats = lambda m: any(not torch.equal(a[0], b[0]) for a, b in zip(before[m], after[m]))  # noqa: E731
    moved_weights = lambda m: any(not torch.equal(a[1], b[1]) for a, b in zip(before[m], after[m]))  # noqa: E731
    assert moved_stats("train") and moved_weights("train")
    assert not moved_stats("eval") and moved_weights("eval")
    assert not moved_stats("frozen") and not moved_weights("frozen")


def test_eval_mode_normalises_a_training_batch_with_the_running_statistics():
    torch.manual_seed(0)
    model = build_model("convnet", 4, 32)
    model.set_batchnorm("eval")
    first = _bn_layers(model)[0]
    first.running_mean.fill_(0.5)
    first.running_var.fill_(4.0)
    model.train()
    x = torch.randn(6, 3, 32, 32)
    seen = {}  # the BatchNorm's own input and output
    handle = first.register_forward_hook(lambda m, i, o: seen.update(input=i[0], output=o.clone()))  # before an in-place ReLU
    model(x)
    handle.remove()
    expected = (seen["input"] - 0.5) / torch.sqrt(torch.tensor(4.0) + first.eps) * first.weight.view(1, -1, 1, 1) \
        + first.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(seen["output"], expected)


@pytest.mark.parametrize("backbone,own", [("convnet", 0.1), ("efficientnet_lite0", 0.01)])
@pytest.mark.parametrize("momentum", [None, 0.3])
def test_batchnorm_momentum_sets_how_far_a_training_batch_moves_the_running_statistics(backbone, own, momentum):
    """running = (1 - m) running + m batch (PyTorch's convention; the variance unbiased), with m the
    backbone's own (PyTorch's 0.1; Lite0's TensorFlow 0.01) unless set; eval mode never moves them."""
    torch.manual_seed(0)
    model = build_model(backbone, 4, 32)
    model.set_batchnorm("train", momentum)
    m = own if momentum is None else momentum
    first = _bn_layers(model)[0]
    assert all(b.momentum == m for b in _bn_layers(model))
    first.running_mean.fill_(0.5)
    first.running_var.fill_(4.0)
    seen = {}
    handle = first.register_forward_hook(lambda mod, i, o: seen.update(input=i[0].detach().clone()))
    model.train()
    model(torch.randn(6, 3, 32, 32) * 2 + 1)
    handle.remove()
    batch_mean = seen["input"].mean((0, 2, 3))
    batch_var = seen["input"].var((0, 2, 3), unbiased=True)
    torch.testing.assert_close(first.running_mean, (1 - m) * 0.5 + m * batch_mean)
    torch.testing.assert_close(first.running_var, (1 - m) * 4.0 + m * batch_var)
    model.set_batchnorm("eval", 0.5)
    kept = first.running_mean.clone()
    model.train()
    model(torch.randn(6, 3, 32, 32))
    assert torch.equal(first.running_mean, kept)


def test_a_run_applies_its_batchnorm_momentum_and_refuses_one_outside_0_1(tiny_config, tmp_path):
    from safetensors.torch import load_file

    run_experiment(tiny_config.updated(batchnorm_momentum=1e-9), tmp_path / "still", quiet=True)
    run_experiment(tiny_config.updated(batchnorm_momentum=1.0), tmp_path / "batch", quiet=True)
    weights = {name: load_file(tmp_path / name / "checkpoint.safetensors") for name in ("still", "batch")}
    key = next(k for k in weights["still"] if k.startswith("global/") and k.endswith("running_var"))
    torch.testing.assert_close(weights["still"][key], torch.ones_like(weights["still"][key]))  # barely moved from 1
    assert (weights["batch"][key] - 1).abs().max() > 1e-3  # the last batch's own variance
    assert json.loads((tmp_path / "still" / "config.json").read_text())["batchnorm_momentum"] == 1e-9
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match=r"--batchnorm-momentum must be in \(0, 1\]"):
            run_experiment(tiny_config.updated(batchnorm_momentum=bad), tmp_path / "bad", quiet=True)
        assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_head_lr_scale_steps_the_linear_head_at_a_multiple_of_the_lr(optimizer):
    """One step from zero momentum: SGD moves a weight by lr * grad, Adam by lr * sign(grad) (first step);
    the head's by head_lr_scale times that, every other weight by the plain step."""
    from fedstyle.algorithms.context import TrainSettings

    torch.manual_seed(0)
    model = build_model("convnet", 4, 32)
    x, y = torch.randn(6, 3, 32, 32), torch.arange(6) % 4
    settings = TrainSettings(lr=0.01, optimizer=optimizer, momentum=0.0, weight_decay=0.0, head_lr_scale=10.0)
    opt = settings.make_optimizer(model.parameters(), model.head.parameters())
    assert [g["lr"] for g in opt.param_groups] == [0.01, pytest.approx(0.1)]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    nn.functional.cross_entropy(model(x), y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    for name, p in model.named_parameters():
        lr = 0.1 if name.startswith("head.") else 0.01
        step = grads[name] if optimizer == "sgd" else grads[name] / (grads[name].abs() + 1e-8)
        torch.testing.assert_close(p.detach(), before[name] - lr * step, rtol=1e-4, atol=1e-6)
    assert len(TrainSettings(lr=0.01).make_optimizer(model.parameters(), model.head.parameters()).param_groups) == 1


def test_head_lr_scale_outside_the_positive_numbers_is_refused(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="--head-lr-scale must be positive, got 0.0"):
        run_experiment(tiny_config.updated(head_lr_scale=0.0), tmp_path / "a", quiet=True)
    assert not (tmp_path / "a").exists()


def test_an_unknown_batchnorm_mode_is_refused_naming_the_choices(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="train, eval, frozen"):
        run_experiment(tiny_config.updated(batchnorm="sometimes"), tmp_path / "a", quiet=True)
    assert not (tmp_path / "a").exists()


def test_a_run_with_frozen_batchnorm_keeps_the_initial_statistics(tiny_config, tmp_path):
    from safetensors.torch import load_file

    run_experiment(tiny_config.updated(batchnorm="eval"), tmp_path / "eval", quiet=True)
    run_experiment(tiny_config, tmp_path / "train", quiet=True)
    weights = {name: load_file(tmp_path / name / "checkpoint.safetensors") for name in ("eval", "train")}
    key = next(k for k in weights["eval"] if k.startswith("global/") and k.endswith("running_var"))
    assert torch.equal(weights["eval"][key], torch.ones_like(weights["eval"][key]))  # never updated
    assert not torch.equal(weights["train"][key], torch.ones_like(weights["train"][key]))
    config = json.loads((tmp_path / "eval" / "config.json").read_text())
    assert config["batchnorm"] == "eval"


def test_per_class_takes_the_same_seeded_subset_of_every_domain(tiny_config):
    full = load_config_dataset(tiny_config, progress=False)
    small = load_config_dataset(tiny_config.updated(per_class=5), progress=False)
    again = load_config_dataset(tiny_config.updated(per_class=5, seed=7), progress=False)  # the run's seed: no effect
    for d in full.domains:
        assert small.class_counts(d).tolist() == [5] * full.num_classes
        assert torch.equal(small.images[d], again.images[d])
        # every kept image is one of the domain's, with its label
        flat = full.images[d].flatten(1)
        for image, label in zip(small.images[d], small.labels[d]):
            match = (flat == image.flatten()).all(1).nonzero().flatten()
            assert len(match) and int(full.labels[d][match[0]]) == int(label)
    everything = load_config_dataset(tiny_config.updated(per_class=TINY_PER_CLASS + 10), progress=False)
    assert all(torch.equal(everything.labels[d], full.labels[d]) for d in full.domains)  # a cap above the size keeps all


def test_per_class_below_one_is_refused(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="--per-class must be at least 1"):
        run_experiment(tiny_config.updated(per_class=0), tmp_path / "a", quiet=True)
    assert not (tmp_path / "a").exists()


def test_fixbn_normalises_by_batch_statistics_before_its_round_and_by_the_frozen_running_ones_from_it():
    """FixBN (Classifier.set_batchnorm's fix_round R): rounds before R train BatchNorm on batch statistics and
    move the running ones; from round R the running statistics normalise the batch, as in evaluation, and
    stay put, while the affine weights still get gradients."""
    torch.manual_seed(0)
    model = build_model("convnet", 4, 32)
    model.set_batchnorm("train", 0.5, fix_round=3)
    first = _bn_layers(model)[0]
    first.running_mean.fill_(0.5)
    first.running_var.fill_(4.0)
    seen = {}
    handle = first.register_forward_hook(lambda m, i, o: seen.update(input=i[0].detach().clone(), output=o.clone()))
    x = torch.randn(6, 3, 32, 32) * 2 + 1
    model.enter_round(2)
    model.train()
    assert model.uses_batch_statistics and first.training
    model(x)
    batch_mean = seen["input"].mean((0, 2, 3))
    torch.testing.assert_close(first.running_mean, 0.5 * 0.5 + 0.5 * batch_mean)  # exploration: statistics move
    normalised = (seen["input"] - batch_mean.view(1, -1, 1, 1)) / torch.sqrt(
        seen["input"].var((0, 2, 3), unbiased=False).view(1, -1, 1, 1) + first.eps)
    torch.testing.assert_close(seen["output"], normalised * first.weight.view(1, -1, 1, 1) + first.bias.view(1, -1, 1, 1))
    mean, var = first.running_mean.clone(), first.running_var.clone()
    model.enter_round(3)
    model.train()
    assert not model.uses_batch_statistics and not first.training and model.training
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    nn.functional.cross_entropy(model(x), y).backward()
    expected = (seen["input"] - mean.view(1, -1, 1, 1)) / torch.sqrt(var.view(1, -1, 1, 1) + first.eps)
    torch.testing.assert_close(seen["output"], expected * first.weight.view(1, -1, 1, 1) + first.bias.view(1, -1, 1, 1))
    assert torch.equal(first.running_mean, mean) and torch.equal(first.running_var, var)  # calibration: frozen
    assert float(first.weight.grad.abs().sum()) > 0 and float(first.bias.grad.abs().sum()) > 0
    model.enter_round(7)
    model.train()
    assert not first.training  # every later round too
    for bad in ({"mode": "eval", "fix_round": 2}, {"mode": "train", "fix_round": -1}):
        with pytest.raises(ConfigError, match="fix round"):
            model.set_batchnorm(bad["mode"], fix_round=bad["fix_round"])


def test_a_fixbn_run_freezes_the_global_running_statistics_from_its_round(tiny_config, tmp_path):
    """Through the federation: with --batchnorm-fix-round 2 the running statistics after 3 rounds are the
    global ones of round 1 (no client moves them after the switch; the average of equal copies to float32
    rounding; without FixBN they move by 0.2-1.1), while the weights go on
    training; without it they keep moving. A constant lr, so round 1 is the same in every run."""
    from safetensors.torch import load_file

    base = tiny_config.updated(lr_schedule="constant", batchnorm_momentum=0.5)
    runs = {"one": base.updated(rounds=1), "fixed": base.updated(rounds=3, batchnorm_fix_round=2),
            "batch": base.updated(rounds=3)}
    weights = {}
    for name, config in runs.items():
        run_experiment(config, tmp_path / name, quiet=True)
        weights[name] = load_file(tmp_path / name / "checkpoint.safetensors")
    stats = [k for k in weights["one"] if k.startswith("global/") and (k.endswith("running_mean") or k.endswith("running_var"))]
    conv = next(k for k in weights["one"] if k.startswith("global/") and k.endswith(".weight") and weights["one"][k].dim() == 4)
    assert stats
    for k in stats:  # the server's weighted average of the clients' equal copies rounds in the last bit
        torch.testing.assert_close(weights["fixed"][k], weights["one"][k], rtol=1e-6, atol=1e-6)
    assert not all(torch.equal(weights["batch"][k], weights["one"][k]) for k in stats)
    assert not torch.equal(weights["fixed"][conv], weights["one"][conv])
    assert json.loads((tmp_path / "fixed" / "config.json").read_text())["batchnorm_fix_round"] == 2
    for bad, message in ((base.updated(batchnorm_fix_round=-1), "must be >= 0"),
                         (base.updated(batchnorm="eval", batchnorm_fix_round=2), "needs --batchnorm train"),
                         (base.updated(rounds=2, batchnorm_fix_round=3), "after the last of --rounds 2")):
        with pytest.raises(ConfigError, match=message):
            run_experiment(bad, tmp_path / "bad", quiet=True)
        assert not (tmp_path / "bad").exists()


def test_fixbn_with_batchnorm_on_the_clients_says_what_it_fixes_there(tiny_config, tmp_path, capsys):
    """Issue 55 item 13: FedBN's BatchNorm is local, so FixBN has no global statistics to fix; the run says, in one
    line, that each client's own running statistics are frozen instead (the FixBN tracks keep their FedBN rows)."""
    from fedstyle.experiments.config import RunConfig

    fixbn = dict(batchnorm="train", batchnorm_fix_round=1, rounds=2)
    for method, hparams in (("fedbn", {}), ("mixstyle", {"local_bn": True}), ("gperxan", {})):
        assert "own running statistics" in RunConfig(method=method, hparams=hparams, **fixbn).batchnorm_fix_note()
    assert RunConfig(method="fedavg", **fixbn).batchnorm_fix_note() is None
    assert RunConfig(method="fedbn", hparams={"local_bn": False}, **fixbn).batchnorm_fix_note() is None
    assert RunConfig(method="fedbn").batchnorm_fix_note() is None
    run_experiment(tiny_config.updated(method="fedbn", **fixbn), tmp_path / "run", quiet=True)
    notes = [line for line in capsys.readouterr().err.splitlines() if "batchnorm-fix-round" in line]
    assert len(notes) == 1 and notes[0].startswith("fedstyle: note:")
