"""The privacy audit on run directories: surfaces equal what the methods send, the attacks' known answers
through the playbook, the CLI's outputs and refusals (the attack library itself: test_audit_attacks.py)."""

from __future__ import annotations

import json

import pytest
import torch

from fedstyle.audit.playbook import AuditSettings, Public, Victim, attack_surface, membership
from fedstyle.audit.run import SURFACES, _normalizer, audit_privacy
from fedstyle.cli.main import main
from fedstyle.errors import ConfigError
from fedstyle.experiments.build import build_experiment
from fedstyle.experiments.runner import run_experiment
from fedstyle.models.batchnorm import batch_statistics
from fedstyle.style.sharing import dataset_style, stage_styles
from fedstyle.style.transfer.augment import client_style, make_backend

FAST = AuditSettings(victims=1, candidates=2, steps=3, shadow_sets=2, max_set=32)


def _config(tiny_config, method, **hp):
    return tiny_config.updated(method=method, hparams=dict(hp), val_fraction=0.25, clients=3, partition="per_domain")


def _surface(tiny_config, method, **hp):
    exp = build_experiment(_config(tiny_config, method, **hp), progress=False)
    exp.model.eval()
    return exp, SURFACES.get(method)(exp, _normalizer(exp))[0]


def test_stablefdg_surface_releases_what_round_query_sends(tiny_config):
    exp, surface = _surface(tiny_config, "stablefdg")
    data = exp.simulator.clients[0]
    sent = dataset_style(exp.model.backbone, data, "layer1", exp.device).as_tensor().flatten().double()
    torch.testing.assert_close(surface.release(data.images), sent, rtol=1e-5, atol=1e-6)
    # the invariant the calibrated membership score rests on: the shared means are the contributions' mean
    torch.testing.assert_close(surface.set_mean(sent), surface.image_vectors(data.images).mean(0), rtol=1e-4, atol=1e-5)


def test_styleddg_surface_releases_the_batch_style_psi(tiny_config):
    exp, surface = _surface(tiny_config.updated(topology="ring"), "styleddg")
    batch = exp.simulator.clients[1].images[:8]
    with batch_statistics(exp.model):
        psi = stage_styles(exp.model.backbone, exp.transform(batch, train=False), ["layer1", "layer2", "layer3"])
    sent = torch.cat([psi[s].flatten() for s in ("layer1", "layer2", "layer3")]).double()
    torch.testing.assert_close(surface.release(batch), sent, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("style_type", ["overall", "single"])
def test_ccst_surface_releases_the_style_upload(tiny_config, style_type):
    exp, surface = _surface(tiny_config, "ccst", style_type=style_type)
    images = exp.simulator.clients[2].images
    backend = make_backend(exp.algorithm.backend_name(), exp.device, **exp.algorithm.backend_options())
    style, _ = client_style(backend, images, style_type=style_type, count=len(images), seed=0, batch_size=64)
    sent = torch.cat([style.tensors["mean"], style.tensors["std"]], 1).double()
    released = surface.release(images)
    torch.testing.assert_close(released, sent if style_type == "single" else sent.flatten(), rtol=1e-4, atol=1e-5)
    assert surface.per_image == (style_type == "single")
    if style_type == "overall":  # all-pixel moments: the shared (mu, sigma) come from the images' mean moments
        torch.testing.assert_close(surface.set_mean(released), surface.image_vectors(images).mean(0), rtol=1e-4,
                                   atol=1e-5)


def _victim_and_public(exp):
    data = exp.simulator.clients[0]
    victim = Victim(0, data.images, data.labels, int(data.domains[0]))
    public = Public({d: exp.source_val[n].images for n in exp.source_val for d in [exp.dataset.domains.index(n)]},
                    {d: exp.source_val[n].labels.long() for n in exp.source_val for d in [exp.dataset.domains.index(n)]},
                    exp.dataset.num_classes)
    return victim, public


def test_per_image_styles_give_perfect_membership_and_a_set_style_of_many_does_not(tiny_config):
    # known answers: a style row computed from one image identifies it (AUC 1); a dataset style over the
    # client's whole set barely moves with one image (AUC well below 1)
    exp, single = _surface(tiny_config, "ccst", style_type="single")
    victim, public = _victim_and_public(exp)
    g = torch.Generator().manual_seed(0)
    rows = torch.arange(0, len(victim.images), 2)
    assert membership(single, victim, rows, public, FAST, g) == 1.0
    _, overall = _surface(tiny_config, "ccst", style_type="overall")
    assert membership(overall, victim, torch.arange(len(victim.images)), public, FAST, g) < 0.9


def test_attack_surface_scores_every_attack(tiny_config):
    exp, surface = _surface(tiny_config, "stablefdg")
    victim, public = _victim_and_public(exp)
    result = attack_surface(surface, [victim], public, lambda x: torch.zeros(len(x), dtype=torch.long), FAST)
    for key in ("recon_psnr", "guess_psnr", "recon_ssim", "membership_auc", "domain_accuracy", "domain_chance"):
        assert key in result.scores and result.scores[key] == result.scores[key], key  # present, not NaN
    assert 0.0 <= result.scores["membership_auc"] <= 1.0
    assert len(result.examples) == FAST.candidates


@pytest.mark.slow
def test_audit_cli_writes_the_report_of_a_run(tiny_config, tmp_path, capsys):
    out = tmp_path / "sfdg"
    run_experiment(_config(tiny_config, "stablefdg"), out, quiet=True)
    code = main(["audit", "privacy", str(out), "--steps", "3", "--victims", "1", "--candidates", "2",
                 "--shadow-sets", "2", "--quiet"])
    assert code == 0
    text = capsys.readouterr().out
    assert "dataset style" in text and "weight update (1 step, batch 1)" in text and "over a guess vs" in text
    report = json.loads((out / "audit" / "privacy.json").read_text())[0]
    assert report["method"] == "stablefdg" and report["round"] == 2
    assert [r["payload"] for r in report["results"]][0] == "dataset style"
    assert (out / "audit" / "reconstructions.png").stat().st_size > 1000
    assert (out / "audit" / "reconstructions.pdf").read_bytes().startswith(b"%PDF")  # beside it, for a paper


def test_a_weights_only_method_gets_the_baseline_rows_only(tiny_config, tmp_path):
    out = tmp_path / "fedavg"
    run_experiment(_config(tiny_config, "fedavg").updated(rounds=1), out, quiet=True)
    written, text = audit_privacy([out], settings=FAST)
    report = json.loads((out / "audit" / "privacy.json").read_text())[0]
    assert {r["method"] for r in report["results"]} == {"fedavg"}
    assert "privacy.md" in {p.name for p in written}
    assert "- verdict: fedavg sends weights only, so the weight update is all a receiver gets" in text
    scores = report["results"][0]["scores"]  # the loss reached beside the loss at the truth, and the gain's interval
    assert scores["truth_loss"] < scores["initial_loss"] and "at the true images" in text
    assert scores["psnr_gain_lo"] <= scores["psnr_gain"] <= scores["psnr_gain_hi"]
    from dataclasses import replace

    written, text = audit_privacy([out], settings=replace(FAST, baseline=False), out=tmp_path / "bare")
    assert {p.name for p in written} == {"privacy.json", "privacy.md"}  # nothing reconstructed: no grid
    assert "sends weights only" in text and "measures nothing" in text


def test_refusals_name_the_fix(tiny_config, tmp_path, capsys):
    out = tmp_path / "noval"
    run_experiment(_config(tiny_config, "fedavg").updated(rounds=1, val_fraction=0.0, selection="last"), out, quiet=True)
    with pytest.raises(ConfigError, match="--val-fraction"):
        audit_privacy([out], settings=FAST)
    assert main(["audit", "privacy", str(out), str(out)]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["audit", "privacy", str(tmp_path / "missing")]) == 2
    assert main(["audit", "privacy", str(out), "--steps", "0"]) == 2
    assert main(["audit", "privacy", str(out), "--canary", "3"]) == 2
    capsys.readouterr()
    finished = tmp_path / "finished"  # its checkpoint deleted: the audit attacked the initial weights, exit 0
    run_experiment(_config(tiny_config, "fedavg").updated(rounds=1), finished, quiet=True)
    (finished / "checkpoint.safetensors").unlink()
    assert main(["audit", "privacy", str(finished)]) == 2
    assert "a finished run without its checkpoint (checkpoint.safetensors): the audit would attack the initial " \
           "weights" in capsys.readouterr().err


@pytest.mark.slow
def test_runs_with_and_without_the_defence_give_the_tradeoff_plot_and_their_epsilon(tiny_config, tmp_path):
    from dataclasses import replace

    from test_audit_known_answers import gdp_epsilon

    clean, noisy = tmp_path / "clean", tmp_path / "noisy"
    run_experiment(_config(tiny_config, "stablefdg").updated(rounds=1), clean, quiet=True)
    run_experiment(_config(tiny_config, "stablefdg", dp_clip=10.0, dp_noise=1.0), noisy, quiet=True)  # 2 rounds
    written, text = audit_privacy([clean, noisy], settings=replace(FAST, baseline=False, canary=16),
                                  out=tmp_path / "audit")
    assert {"tradeoff.png", "tradeoff.pdf"} <= {p.name for p in written}
    reports = json.loads((tmp_path / "audit" / "privacy.json").read_text())
    assert reports[0]["epsilon"] is None
    # the headline is what the receiver holds: every client was sampled in both rounds, so 2 releases each, and
    # eps over both by an independent accountant (GDP with mu = sqrt(2) / z, solved with scipy)
    assert reports[1]["releases"] == 2 and "counters" in reports[1]["releases_from"]
    assert reports[1]["epsilon"] == pytest.approx(gdp_epsilon(1.0, 2, 1e-5), rel=1e-6)
    assert reports[1]["epsilon_per_release"] == pytest.approx(4.3772, abs=1e-3)  # z = 1, delta = 1e-5
    logged = [json.loads(line) for line in (noisy / "metrics.jsonl").read_text().splitlines()]
    assert reports[1]["epsilon"] == pytest.approx(logged[-1]["train_metrics"]["dp_epsilon_total"], rel=1e-5)
    assert "eps = 6.57 over all 2 releases" in text and "4.38 per release" in text
    assert "C clips" in text and "not accounted for in eps" in text
    # the receiver also attacks the mean of each sender's two releases (noise / sqrt(2))
    assert [r["payload"] for r in reports[1]["results"]] == ["dataset style", "dataset style, mean of 2 releases"]
    assert 0 < reports[1]["results"][0]["scores"]["public_clip"]
    # --canary: every release audited with a planted canary, beside the analytic eps of what was audited
    clean_canary = reports[0]["results"][0]["scores"]
    assert (clean_canary["canary_tpr"], clean_canary["canary_fpr"]) == (1.0, 0.0)  # no noise, no clipping: found
    one, both = (r["scores"] for r in reports[1]["results"])
    assert one["canary_epsilon"] == pytest.approx(4.3772, abs=1e-3) and both["canary_epsilon"] == reports[1]["epsilon"]
    assert one["canary_epsilon_lb"] <= one["canary_epsilon"] and both["canary_epsilon_lb"] <= both["canary_epsilon"]
    assert "canary: eps >= " in text and "analytic for the same release" in text and "canary: no noise" in text
    # the defended payload is not the clean one: the audit released it through the run's clipping and noise
    exp_clean, clean_surface = _surface(tiny_config, "stablefdg")
    _, noisy_surface = _surface(tiny_config, "stablefdg", dp_clip=10.0, dp_noise=1.0)
    images = exp_clean.simulator.clients[0].images
    assert not torch.allclose(clean_surface.release(images), noisy_surface.release(images))
