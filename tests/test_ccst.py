"""CCST (Algorithm 1 of ccst.txt) with a fake style backend whose outputs reveal the style used."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedstyle.algorithms import METHODS
from fedstyle.algorithms import ccst as ccst_module
from fedstyle.cli.main import main
from fedstyle.data.transforms import BatchTransform
from fedstyle.errors import ConfigError
from fedstyle.experiments.runner import resume_experiment, run_experiment
from fedstyle.algorithms.context import ServerContext
from fedstyle.data.client import ClientData
from fedstyle.federation.star import FederationSettings, StarSimulator
from fedstyle.models import build_model
from fedstyle.seeding import seed_everything
from fedstyle.style.mixstyle import MixStyle
from fedstyle.style.transfer import TRANSFER_BACKENDS, Style, StyleMismatchError, StyleTransfer
from fedstyle.style.transfer.augment import StyleBank, plan_cross_client

SIZE, PER_CLIENT, BAND = 16, 20, 80  # client c's pixels lie in [80c, 80c + 40)


class FakeTag(StyleTransfer):
    """Style = mean pixel value of an image (a "tag" that names its client); transfer = a constant image
    of the style's tag, so every output shows which style produced it. Counts transfer calls."""

    name = "fake_tag"
    calls = 0

    def __init__(self, device="cpu"):
        pass

    @property
    def encoder_id(self) -> str:
        return "fake"

    def image_styles(self, images):
        return Style(self.name, self.encoder_id, {"tag": images.float().mean(dim=(1, 2, 3))[:, None]})

    def dataset_style(self, batches):
        batches = [b.float() for b in batches]
        return Style(self.name, self.encoder_id, {"tag": torch.cat(batches).mean().reshape(1, 1)})

    def transfer(self, content, style, alpha=1.0):
        self.check(style)
        FakeTag.calls += 1
        tag = style.tensors["tag"].expand(content.shape[0], 1).round().to(torch.uint8)
        return tag.view(-1, 1, 1, 1).expand(-1, 3, *content.shape[-2:]).clone()


if "fake_tag" not in TRANSFER_BACKENDS:
    TRANSFER_BACKENDS.add("fake_tag", FakeTag)

TRANSFORM = BatchTransform((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "none")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """Each test starts with an empty stylization cache."""
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))
    FakeTag.calls = 0


def make_clients(n=3, per_client=PER_CLIENT):
    g = torch.Generator().manual_seed(0)
    clients = []
    for c in range(n):
        images = (BAND * c + torch.randint(0, 40, (per_client, 3, SIZE, SIZE), generator=g)).to(torch.uint8)
        labels = torch.arange(per_client) % 4
        clients.append(ClientData(images, labels, torch.full((per_client,), c), TRANSFORM))
    return clients


def simulator(hp=None, clients=None, method="ccst"):
    """A star simulator over ``clients``; stylize=eager unless ``hp`` says otherwise, so that the setup's
    metrics count every generated image (the lazy default is tested against it below)."""
    seed_everything(0)
    model = build_model("convnet", 4, SIZE)
    clients = clients if clients is not None else make_clients()
    hp = {"style_backend": "fake_tag", "stylize": "eager", **(hp or {})}
    algo = METHODS.get(method)(hp, num_classes=4, num_clients=len(clients))
    algo.configure_model(model)
    settings = FederationSettings(rounds=1, lr=0.05, batch_size=8, local_steps=1)
    return StarSimulator(algo, model, clients, settings, seed=0, device=torch.device("cpu"))


def domain_of(image: torch.Tensor) -> int:
    return int(image.float().mean()) // BAND


@pytest.mark.parametrize("style_type,k", [("overall", 2), ("single", 3), ("overall", 1)])
def test_algorithm1_invariants(style_type, k):
    originals = make_clients()
    sim = simulator({"style_type": style_type, "k": k}, clients=make_clients())
    info = sim.setup()
    own_kept = 0
    for c, data in enumerate(sim.clients):
        d = PER_CLIENT
        assert len(data) == d * k and data.images.shape == (d * k, 3, SIZE, SIZE) and data.images.dtype == torch.uint8
        assert torch.equal(data.labels, originals[c].labels.repeat_interleave(k))
        assert torch.equal(data.domains, originals[c].domains.repeat_interleave(k))
        for i in range(d):
            outputs = data.images[i * k : (i + 1) * k]
            domains = [domain_of(o) for o in outputs]
            assert len(set(domains)) == k  # K distinct domains per image
            for o, dom in zip(outputs, domains):
                if dom == c:  # own domain drawn: the original pixels
                    assert torch.equal(o, originals[c].images[i])
                    own_kept += 1
                else:  # another domain: a pure transfer output (constant image of that domain's tag)
                    assert bool((o == o.flatten()[0]).all())
    # own domain drawn with probability k / 3: always when k = 3, sometimes otherwise
    assert own_kept == 3 * PER_CLIENT if k == 3 else 0 < own_kept < 3 * PER_CLIENT
    assert info["augmented_images"] == 3 * PER_CLIENT * k
    assert info["stylized_images"] == 3 * PER_CLIENT * k - own_kept
    assert info["style_images"] == (3 * PER_CLIENT if style_type == "overall" else 3 * 1)  # J = ceil(20 / 32) = 1
    assert info["style_images_per_s"] > 0 and info["stylized_images_per_s"] > 0


def test_overall_style_bytes_are_counted_up_and_down():
    sim = simulator({"style_type": "overall", "k": 2})
    info = sim.setup()
    # up: "fake_tag" (8 bytes) + "fake" (4) + one float32 tag, per client
    up = 3 * (8 + 4 + 4)
    # down, to each of the 3 clients: the strings, 3 tags and 3 int64 owners
    down = 3 * (8 + 4 + 3 * 4 + 3 * 8)
    assert sim.traffic.payload_up == up and sim.traffic.payload_down == down
    assert info["setup_bytes_up"] == up and info["setup_bytes_down"] == down


def test_single_bank_holds_j_styles_per_client_and_bytes_scale_with_j():
    sim = simulator({"style_type": "single", "j": 5, "k": 2})
    algo = sim.algo
    uploads = {c: algo.setup_upload(sim.context(c, -1, "setup"), sim.model) for c in range(3)}
    assert all(len(Style.from_payload(u)) == 5 for u in uploads.values())
    bank = StyleBank.from_payload(algo.setup_broadcast(uploads, sim.server))
    assert bank.owner.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    # every style of client c's bank is the tag of one of its images
    assert all(int(t) // BAND == c for t, c in zip(bank.style.tensors["tag"].flatten(), bank.owner))
    sim.setup()
    assert sim.traffic.payload_up == 3 * (8 + 4 + 5 * 4)


def test_plan_draws_k_distinct_domains_and_styles_within_the_drawn_domain():
    owner = torch.tensor([0] * 4 + [1] * 6 + [2] * 5)
    bank = StyleBank(Style("x", "y", {"s": torch.zeros(15, 1)}), owner)
    plan = plan_cross_client(200, bank, own=1, k=3, seed=7)
    rows = plan.style_row.view(200, 3)
    assert torch.equal(plan.source, torch.arange(200).repeat_interleave(3))
    assert bool(((rows == -1).sum(1) == 1).all())  # k = all 3 domains: own drawn exactly once per image
    others = rows[rows >= 0]
    assert set(owner[others].tolist()) == {0, 2} and len(set(others.tolist())) == 9  # every style used
    # reference code: one style per domain per batch of 32 consecutive images
    ref = plan_cross_client(64, bank, own=1, k=2, seed=7, per_batch=32).style_row.view(64, 2)
    for batch in (ref[:32], ref[32:]):
        for dom in (0, 2):
            chosen = batch[(batch >= 0) & (owner[batch.clamp(min=0)] == dom)]
            assert len(set(chosen.tolist())) <= 1
    assert torch.equal(plan_cross_client(200, bank, own=1, k=3, seed=7).style_row, plan.style_row)  # seeded


# -- keep_original: Algorithm 1 (own_domain) against originals always kept ------------------------
MANY, TINY = 100, 2  # 100 clients of d = 2 images: the many-clients setting where Algorithm 1 loses the originals
TAG0 = 50  # client c's images are filled with TAG0 + c, so a transfer output's constant value names its client


def make_many_clients(n=MANY, per_client=TINY):
    """Client c: images filled with TAG0 + c except one pixel per image (so an original is never a constant
    image and no two originals are equal); its overall tag still rounds to TAG0 + c (the odd pixel moves
    the mean by at most (TAG0 + 98) / 768 < 0.2)."""
    clients = []
    for c in range(n):
        images = torch.full((per_client, 3, SIZE, SIZE), TAG0 + c, dtype=torch.uint8)
        images[:, 0, 0, 0] = torch.arange(per_client, dtype=torch.uint8) + 1
        clients.append(ClientData(images, torch.arange(per_client) % 4, torch.full((per_client,), c), TRANSFORM))
    return clients


def restyled_client(output: torch.Tensor) -> int | None:
    """The client whose style made ``output`` (a constant image of its tag), None for an original."""
    value = int(output.flatten()[0])
    return value - TAG0 if bool((output == value).all()) else None


def test_keep_original_always_at_100_tiny_clients_gives_d_originals_plus_d_k_restyled():
    k, d = 3, TINY
    originals = make_many_clients()
    always = simulator({"k": k, "keep_original": "always"}, clients=make_many_clients())
    info = always.setup()
    for c, data in enumerate(always.clients):
        # by hand: d originals + d * K restyled = 2 + 6 = 8 images, image i's original first, then its K copies
        assert len(data) == d + d * k == 8
        assert torch.equal(data.labels, originals[c].labels.repeat_interleave(k + 1))
        for i in range(d):
            outputs = data.images[i * (k + 1) : (i + 1) * (k + 1)]
            assert torch.equal(outputs[0], originals[c].images[i])
            styled = [restyled_client(o) for o in outputs[1:]]
            assert None not in styled and c not in styled and len(set(styled)) == k  # K distinct other clients
    assert info["augmented_images"] == MANY * 8 and info["stylized_images"] == MANY * d * k

    # the default, Algorithm 1: d * K = 6 images; the original only where the client drew itself
    default = simulator({"k": k}, clients=make_many_clients())
    info = default.setup()
    kept_per_client = []
    for c, data in enumerate(default.clients):
        assert len(data) == d * k == 6
        kept = 0
        for i in range(d):
            outputs = data.images[i * k : (i + 1) * k]
            drawn = [restyled_client(o) for o in outputs]
            kept += drawn.count(None)
            assert all(torch.equal(o, originals[c].images[i]) for o, who in zip(outputs, drawn) if who is None)
            drawn = [c if who is None else who for who in drawn]  # the original stands for the own domain
            assert len(set(drawn)) == k  # K distinct domains of the bank, the own one at most once
        kept_per_client.append(kept)
    # the own domain is drawn with probability K / N = 3 / 100 per image: most clients keep no original at all
    assert sum(kept_per_client) == MANY * d * k - info["stylized_images"]
    assert info["augmented_images"] == MANY * d * k
    assert sum(n == 0 for n in kept_per_client) >= 80


def test_keep_original_always_with_k_n_minus_1_holds_the_images_of_algorithm1_with_k_n():
    """The paper's setting (clients = domains, K = N = 3): every image keeps its original and gets the other
    two domains; keep_original=always with K = N - 1 = 2 gives the same images (in another order)."""
    paper = simulator({"k": 3}, clients=make_clients())
    paper.setup()
    always = simulator({"k": 2, "keep_original": "always"}, clients=make_clients())
    always.setup()
    for a, b in zip(paper.clients, always.clients):
        assert len(a) == len(b) == 3 * PER_CLIENT
        for i in range(PER_CLIENT):
            ours = sorted(tuple(o.flatten().tolist()) for o in a.images[3 * i : 3 * i + 3])
            theirs = sorted(tuple(o.flatten().tolist()) for o in b.images[3 * i : 3 * i + 3])
            assert ours == theirs


def test_plan_keep_original_always_puts_the_original_first_and_k_other_domains():
    owner = torch.tensor([0] * 4 + [1] * 6 + [2] * 5)
    bank = StyleBank(Style("x", "y", {"s": torch.zeros(15, 1)}), owner)
    plan = plan_cross_client(200, bank, own=1, k=2, seed=7, keep_original="always")
    rows = plan.style_row.view(200, 3)
    assert torch.equal(plan.source, torch.arange(200).repeat_interleave(3))
    assert bool((rows[:, 0] == -1).all()) and bool((rows[:, 1:] >= 0).all())
    assert bool((owner[rows[:, 1:]] != 1).all()) and bool((owner[rows[:, 1]] != owner[rows[:, 2]]).all())
    # the default is Algorithm 1, unchanged by naming it
    assert torch.equal(plan_cross_client(200, bank, own=1, k=3, seed=7).style_row,
                       plan_cross_client(200, bank, own=1, k=3, seed=7, keep_original="own_domain").style_row)
    with pytest.raises(ConfigError, match="k=3 restyled copies.*only 2 domains besides client 1"):
        plan_cross_client(10, bank, own=1, k=3, seed=7, keep_original="always")
    with pytest.raises(ConfigError, match="not one of own_domain, always"):
        plan_cross_client(10, bank, own=1, k=1, seed=7, keep_original="sometimes")


def test_keep_original_hparam_default_label_and_limits():
    ccst = METHODS.get("ccst")
    assert ccst.resolve({})["keep_original"] == "own_domain"  # Algorithm 1 by default
    hp = ccst.resolve({"keep_original": "always", "k": 2})
    assert ccst.display_name(hp) == "CCST (overall, K=2 + original)"
    with pytest.raises(ConfigError, match="not one of own_domain, always"):
        ccst.resolve({"keep_original": "yes"})
    with pytest.raises(ConfigError, match="k=3 restyled copies.*choose k <= 2"):
        ccst({"keep_original": "always", "k": 3}, num_classes=4, num_clients=3)
    ccst({"keep_original": "always", "k": 2}, num_classes=4, num_clients=3)  # K = N - 1 is allowed


def test_cache_key_holds_keep_original(tmp_path, monkeypatch):
    """An entry made under one keep_original is never reused under the other, even for an identical plan."""
    real = ccst_module.plan_cross_client

    def same_plan(*args, keep_original, **kwargs):  # both settings get Algorithm 1's plan: only the key differs
        return real(*args, keep_original="own_domain", **kwargs)

    monkeypatch.setattr(ccst_module, "plan_cross_client", same_plan)
    assert "cache_hits" not in simulator({"k": 2}).setup()
    assert simulator({"k": 2}).setup()["cache_hits"] == 3  # same setting: reused
    info = simulator({"k": 2, "keep_original": "always"}).setup()
    assert "cache_hits" not in info and info["stylized_images"] > 0  # other setting: generated anew
    recipes = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "ccst").glob("*/recipe.json")]
    assert sorted(r["keep_original"] for r in recipes) == ["always"] * 3 + ["own_domain"] * 3


def test_k_larger_than_the_bank_is_a_clear_error(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="k=4.*only 3 source clients"):
        METHODS.get("ccst")({"k": 4}, num_classes=4, num_clients=3)
    with pytest.raises(ConfigError, match="k=4.*only 3 source clients"):  # before anything is written
        run_experiment(tiny_config.updated(method="ccst", hparams={"k": 4}), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
    # the bank itself is checked too (e.g. a bank with fewer domains than clients)
    sim = simulator({"k": 3})
    uploads = {c: sim.algo.setup_upload(sim.context(c, -1, "setup"), sim.model) for c in (0, 1)}
    with pytest.raises(ConfigError, match="k=3.*only 2 domains"):
        sim.algo.setup_download(sim.context(0, -1, "setup"), sim.model, sim.algo.setup_broadcast(uploads, sim.server))


def test_empty_and_mixed_banks_are_refused():
    algo = METHODS.get("ccst")({"style_backend": "fake_tag"}, num_classes=4, num_clients=3)
    server = ServerContext(weights={}, state={}, round=0, num_clients=3, seed=0)
    with pytest.raises(StyleMismatchError, match="empty"):
        algo.setup_broadcast({}, server)
    with pytest.raises(StyleMismatchError, match="empty"):
        StyleBank.from_payload({"bank/backend": "fake_tag", "bank/encoder": "fake"})
    fake = FakeTag().image_styles(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
    fft = TRANSFER_BACKENDS.get("fft")(device="cpu").image_styles(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(StyleMismatchError, match="cannot mix"):
        algo.setup_broadcast({0: fake.to_payload(), 1: fft.to_payload()}, server)
    # a bank made by another backend than this client's is refused at download
    sim = simulator()
    foreign = StyleBank(fft, torch.tensor([0, 1])).to_payload()
    with pytest.raises(StyleMismatchError, match="fft"):
        sim.algo.setup_download(sim.context(0, -1, "setup"), sim.model, foreign)


def test_second_setup_reuses_the_cache_without_transfer_calls():
    first = simulator({"k": 2})
    info1 = first.setup()
    calls = FakeTag.calls
    assert calls > 0 and "cache_hits" not in info1
    second = simulator({"k": 2}, clients=make_clients())
    info2 = second.setup()
    assert FakeTag.calls == calls  # nothing stylized again
    assert info2["cache_hits"] == 3 and "stylized_images" not in info2
    for a, b in zip(first.clients, second.clients):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    third = simulator({"k": 2, "alpha": 0.5}, clients=make_clients())  # another recipe: generated anew
    third.setup()
    assert FakeTag.calls > calls


def test_a_failed_generation_keeps_only_complete_rows_and_a_rerun_finishes_it(tmp_path, monkeypatch):
    """A transfer that fails mid-setup (out of memory, a kill) leaves the entry with only whole rows marked
    made; the next run makes the rest, and its images equal those of a run with an empty cache."""
    original = FakeTag.transfer

    def failing(self, content, style, alpha=1.0):
        if FakeTag.calls == 1:
            raise RuntimeError("out of memory")
        return original(self, content, style, alpha)

    monkeypatch.setattr(FakeTag, "transfer", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        simulator({"k": 2, "transfer_batch": 8}).setup()
    root = tmp_path / "cache" / "ccst"
    [entry] = [p for p in root.iterdir()]  # the entry (no staging folder left) of the client that failed
    made = np.load(entry / "made.npy") != 0  # a row's checksum once it is made, 0 before
    assert 0 < made.sum() < len(made)  # the batch before the failure is kept, the failed one is not marked
    images = np.load(entry / "images.npy")
    assert (images[made == 0] == 0).all()  # unmarked rows were never written
    monkeypatch.setattr(FakeTag, "transfer", original)
    resumed = simulator({"k": 2, "transfer_batch": 8})
    info = resumed.setup()
    assert info["cached_images"] == made.sum() and info["stylized_images"] > 0
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "fresh"))
    fresh = simulator({"k": 2, "transfer_batch": 8})
    fresh.setup()
    for a, b in zip(resumed.clients, fresh.clients):
        assert torch.equal(a.images, b.images)


def test_grayscale_and_zero_variance_clients_through_the_fft_backend():
    clients = make_clients()
    flat = clients[0].images[:, :1] * 0 + 77  # one channel (grayscale) and zero variance
    clients[0] = ClientData(flat.contiguous(), clients[0].labels, clients[0].domains, TRANSFORM)
    sim = simulator({"style_backend": "fft", "k": 3}, clients=clients)
    sim.setup()
    data = sim.clients[0]
    assert data.images.shape == (3 * PER_CLIENT, 3, SIZE, SIZE) and data.images.dtype == torch.uint8
    kept = [o for o in data.images if bool((o == 77).all())]
    assert len(kept) == PER_CLIENT  # k = all domains: every image keeps its original once, as 3 channels
    # the stylized copies of a constant image carry the other domains' low-frequency amplitude (no NaN -> 0)
    assert all(float(o.float().std()) > 0 for o in data.images if not bool((o == 77).all()))


def test_hparams_shorthand_reference_code_and_labels():
    ccst = METHODS.get("ccst")
    hp = ccst.resolve({"style": "single", "k": "2"})
    assert hp["style_type"] == "single" and hp["style"] == "none" and hp["k"] == 2
    assert ccst.display_name(hp) == "CCST (single, K=2)"
    assert ccst.display_name(ccst.resolve({})) == "CCST (overall, K=3)"
    with pytest.raises(ConfigError, match="contradicts"):
        ccst.resolve({"style": "single", "style_type": "overall"})
    with pytest.raises(ConfigError, match="not a style backend.*fft"):
        ccst.resolve({"style_backend": "nope"})
    with pytest.raises(ConfigError, match="vgg_weights is an option of the adain backend"):
        ccst.resolve({"vgg_weights": "vgg.pth"})  # default backend lite
    ref = ccst.resolve({"reference_code": "true"})
    assert ref["aggregation"] == "uniform"
    assert ccst.resolve({"reference_code": "true", "aggregation": "size"})["aggregation"] == "size"
    assert ccst.resolve(ref) == ref  # a resolved config resolves to itself (resume)
    mixed = ccst.resolve({"style": "mixstyle", "style_type": "single", "style_backend": "fft"})
    assert ccst.display_name(mixed) == "CCST (single, K=3, fft) + MixStyle"


def test_ccst_with_mixstyle_inserts_the_op_and_trains():
    sim = simulator({"style": "mixstyle", "k": 2})
    assert any(isinstance(m, MixStyle) for m in sim.model.modules())
    sim.setup()
    result = sim.run_round(0)
    assert torch.isfinite(torch.tensor(result.train_loss))


def test_reference_code_uses_one_style_per_batch():
    hp = {"style_type": "single", "reference_code": True, "j": 4, "k": 2}
    sim = simulator(hp, clients=make_clients(per_client=32))
    sim.setup()
    assert sim.algo.hp["aggregation"] == "uniform"
    for c, data in enumerate(sim.clients):
        tags = {}
        for o in data.images:
            if bool((o == o.flatten()[0]).all()):
                tags.setdefault(domain_of(o), set()).add(int(o.flatten()[0]))
        assert all(len(v) == 1 for v in tags.values())  # 32 images = one batch: one style per domain


# -- whole runs ------------------------------------------------------------------------------
def _strip(obj):
    """Drop wall-clock times and cache facts, which differ between otherwise identical runs."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items()
                if k != "seconds" and not k.endswith(("_seconds", "_per_s"))
                and k not in ("cache_hits", "cached_images", "stylized_images", "style_cache_hits")}
    return obj


def _lines(run_dir):
    return [_strip(json.loads(line)) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_logs_setup_and_resume_equals_uninterrupted(tiny_config, tmp_path, monkeypatch):
    config = tiny_config.updated(method="ccst", rounds=3, hparams={"style_backend": "fft", "k": 2})
    full = run_experiment(config, tmp_path / "full", quiet=True)
    first = json.loads((tmp_path / "full" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["event"] == "setup" and first["augmented_images"] > 0 and first["style_seconds"] > 0
    assert first["setup_bytes_up"] > 0 and first["cached_images"] == 0 and "stylized_images" not in first
    made = [r["train_metrics"]["stylized_images"] for r in map(json.loads, (tmp_path / "full" / "metrics.jsonl")
            .read_text().splitlines()[1:]) if "stylized_images" in r.get("train_metrics", {})]
    assert made and made[0] > 0  # stylize=lazy: the images are made by the training batches that read them
    assert full["label"] == "CCST (overall, K=2, fft)"

    original = StarSimulator.run_round

    def interrupted(self, round_index):
        if round_index == 2:
            raise KeyboardInterrupt
        return original(self, round_index)

    monkeypatch.setattr(StarSimulator, "run_round", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "cut", quiet=True)
    monkeypatch.setattr(StarSimulator, "run_round", original)
    resumed = resume_experiment(tmp_path / "cut", quiet=True)
    assert _strip(resumed) == _strip(full)
    assert _lines(tmp_path / "cut") == _lines(tmp_path / "full")
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert sum('"event": "setup"' in line for line in lines) == 1  # the resumed run kept the original line
    assert main(["report", str(tmp_path / "cut"), "--out", str(tmp_path / "rep")]) == 0  # the setup line is tolerated
