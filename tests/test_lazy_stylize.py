"""Issue 27: generated images made when a batch first reads them (stylize=lazy), and styles from a
class-stratified sample (style_images). Lazy and eager must give the same pixels and the same training."""

from __future__ import annotations

import pytest
import torch

from fedstyle.algorithms import METHODS
from fedstyle.data.client import ClientData
from fedstyle.data.lazy import LazyImages, MakeCount, read_images
from fedstyle.data.rowstore import row_sums
from fedstyle.data.transforms import BatchTransform
from fedstyle.errors import ConfigError
from fedstyle.federation.star import FederationSettings, StarSimulator
from fedstyle.models import build_model
from fedstyle.seeding import derive_seed, seed_everything
from fedstyle.style.transfer.augment import style_sample
from fedstyle.style.transfer.stylize import made_so_far

from test_ccst import FakeTag, fresh_cache  # noqa: F401  (the fake_tag backend; an empty cache per test)

SIZE, PER_CLIENT = 16, 24
TRANSFORM = BatchTransform((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "crop_flip")


def make_clients(n=3, per_client=PER_CLIENT):
    g = torch.Generator().manual_seed(0)
    clients = []
    for c in range(n):
        tint = torch.tensor([1.0 if k == c % 3 else 0.4 for k in range(3)]).view(1, 3, 1, 1)
        labels = torch.arange(per_client) % 4
        base = (labels * 40 + 40).view(-1, 1, 1, 1).float()
        images = ((base + torch.randint(0, 60, (per_client, 3, SIZE, SIZE), generator=g)) * tint).clamp(0, 255)
        clients.append(ClientData(images.to(torch.uint8), labels, torch.full((per_client,), c), TRANSFORM))
    return clients


def simulator(method, hp, steps=2):
    seed_everything(0)
    clients = make_clients()
    model = build_model("convnet", 4, SIZE)
    algo = METHODS.get(method)(hp, num_classes=4, num_clients=len(clients))
    algo.configure_model(model)
    settings = FederationSettings(rounds=2, lr=0.05, batch_size=8, local_steps=steps)
    return StarSimulator(algo, model, clients, settings, seed=0, device=torch.device("cpu"))


def lazy_stores(sim):
    return [s for data in sim.clients for s in (data.pool.images, *data.views.values()) if isinstance(s, LazyImages)]


# -- LazyImages ----------------------------------------------------------------------------------------
def test_lazy_images_make_each_missing_row_once_in_sorted_batches():
    store = torch.zeros(10, 3, 2, 2, dtype=torch.uint8)
    asked = []

    def make(rows):
        asked.append(rows.tolist())
        return (rows + 1).to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 2, 2).clone()

    lazy = LazyImages(store, make, batch_size=2)
    assert len(lazy) == 10 and lazy.shape == (10, 3, 2, 2) and lazy.dim() == 4 and lazy.dtype == torch.uint8
    out = lazy.index_select(0, torch.tensor([7, 3, 7, 1]))
    assert out[:, 0, 0, 0].tolist() == [8, 4, 8, 2]  # the rows asked for, in the order asked, repeats kept
    assert asked == [[1, 3], [7]]  # distinct, sorted, batch_size at a time
    lazy.index_select(0, torch.tensor([3, 4]))
    assert asked[-1] == [4]  # row 3 is not made again
    assert (lazy.made != 0).astype(int).tolist() == [0, 1, 0, 1, 1, 0, 0, 1, 0, 0] and lazy.count.images == 4
    assert lazy.made[1] == row_sums(store[1:2])[0]  # each made row carries its checksum
    copy = lazy.to("cpu")
    assert copy is lazy
    assert read_images(lazy)[:, 0, 0, 0].tolist() == list(range(1, 11))  # reading all makes the rest
    assert lazy.count.images == 10 and int((lazy.made != 0).sum()) == 10
    with pytest.raises(ValueError, match="make returned"):
        LazyImages(torch.zeros(2, 3, 2, 2, dtype=torch.uint8),
                   lambda rows: torch.zeros(len(rows), 1, 2, 2, dtype=torch.uint8)).materialize()


def test_made_so_far_counts_a_store_and_its_device_copies_once():
    count = MakeCount(images=5, seconds=2.0, transferred=3)
    lazy = LazyImages(torch.zeros(5, 3, 1, 1, dtype=torch.uint8), lambda r: None, count=count)
    twin = LazyImages(lazy.rows, lazy.make, "meta", count=count)  # what .to(device) builds
    assert made_so_far(lazy, twin, torch.zeros(3)) == (3.0, 2.0)


# -- CCST and PARDON: lazy = eager ---------------------------------------------------------------------
@pytest.mark.parametrize("method,backend", [("ccst", "fft"), ("ccst", "lite"), ("pardon", "fft"), ("pardon", "lite")])
def test_lazy_and_eager_give_the_same_images_and_the_same_training(method, backend, tmp_path, monkeypatch):
    """Bit for bit on CPU: a row's pixels do not depend on the rows it is made with, so two rounds of
    training on lazily made images equal those on images all made at setup."""
    runs = {}
    for mode in ("eager", "lazy"):
        monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / mode))  # each mode makes its own images
        sim = simulator(method, {"style_backend": backend, "stylize": mode, "k": 2} if method == "ccst"
                        else {"style_backend": backend, "stylize": mode})
        info = sim.setup()
        made_at_setup = sum(s.count.images for s in lazy_stores(sim))
        losses = [sim.run_round(r).train_loss for r in range(2)]
        runs[mode] = (sim, info, losses, made_at_setup)
    eager, lazy = runs["eager"][0], runs["lazy"][0]
    assert runs["lazy"][3] == 0 and "stylized_images" not in runs["lazy"][1]  # nothing made at setup
    assert runs["eager"][1]["stylized_images"] > 0 and not lazy_stores(eager)
    assert runs["lazy"][2] == runs["eager"][2]  # the same losses ...
    for k, v in eager.server.weights.items():  # ... and the same weights
        assert torch.equal(v, lazy.server.weights[k]), k
    made = sum(s.count.images for s in lazy_stores(lazy))
    assert 0 < made < sum(len(d) for d in lazy.clients)  # 2 rounds x 2 steps x 8 images: a part of the data
    for a, b in zip(eager.clients, lazy.clients):  # and every image, once made, equal
        assert torch.equal(a.images, b.images)
        for name in a.views:
            assert torch.equal(a.views[name], read_images(b.views[name]))


def test_rows_are_made_when_read_counted_per_round_and_reused_by_the_next_run(tmp_path):
    sim = simulator("ccst", {"style_backend": "fake_tag", "k": 2}, steps=1)
    info = sim.setup()
    assert FakeTag.calls == 0 and info["cached_images"] == 0 and info["augmented_images"] == 3 * PER_CLIENT * 2
    result = sim.run_round(0)
    stores = lazy_stores(sim)
    made_rows = [int((s.made != 0).sum()) for s in stores]
    assert all(0 < m <= 8 for m in made_rows)  # one batch of 8 per client
    transferred = [s.count.transferred for s in stores]
    assert result.metrics["stylized_images"] == pytest.approx(sum(transferred) / 3)  # mean over the clients
    assert result.metrics["stylize_seconds"] > 0
    again = simulator("ccst", {"style_backend": "fake_tag", "k": 2}, steps=1)
    info = again.setup()
    assert info["cached_images"] == sum(made_rows)
    calls = FakeTag.calls
    assert again.run_round(0).metrics["stylized_images"] == 0 and FakeTag.calls == calls  # same batches: all cached


def test_an_unknown_stylize_mode_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="stylize.*lazy.*eager"):
        METHODS.get("ccst").resolve({"stylize": "later"})


# -- style_images ------------------------------------------------------------------------------------
def test_style_sample_keeps_the_class_mix_by_largest_remainder():
    labels = torch.tensor([0] * 6 + [1] * 3 + [2] * 1)
    rows = style_sample(labels, 5, seed=1)
    # by hand: quotas 5 * (6, 3, 1) / 10 = 3, 1.5, 0.5 -> floors 3, 1, 0; one left, the tie goes to class 1
    assert torch.bincount(labels[rows], minlength=3).tolist() == [3, 2, 0]
    assert torch.equal(rows, rows.sort().values) and len(set(rows.tolist())) == 5
    assert torch.equal(rows, style_sample(labels, 5, seed=1))  # seeded
    assert any(not torch.equal(rows, style_sample(labels, 5, seed=s)) for s in range(2, 6))
    assert style_sample(labels, 0, seed=1) is None and style_sample(labels, 10, seed=1) is None  # all images
    big = torch.arange(1000) % 7
    counts = torch.bincount(big[style_sample(big, 300, seed=0)], minlength=7)
    assert counts.sum() == 300 and int(counts.max() - counts.min()) <= 1


def test_ccst_overall_style_is_the_mean_over_the_sample():
    """fake_tag's overall style is the mean pixel of the images it is given: with style_images = 8 it must be
    the mean over the stratified sample of 8, with 0 over all 24."""
    for count in (8, 0):
        sim = simulator("ccst", {"style_backend": "fake_tag", "k": 2, "style_images": count})
        ctx = sim.context(0, -1, "setup")
        upload = sim.algo.setup_upload(ctx, sim.model)
        images, labels = sim.clients[0].images, sim.clients[0].labels
        rows = style_sample(labels, count, derive_seed(ctx.seed, "ccst-styles", "sample"))
        chosen = images if rows is None else images[rows]
        assert len(chosen) == (8 if count else PER_CLIENT)
        expected = chosen.float().mean()
        assert float(upload["style/tensor/tag"].reshape(())) == pytest.approx(float(expected), rel=1e-6)


def test_reference_code_computes_styles_over_every_image():
    assert METHODS.get("ccst").resolve({})["style_images"] == 2048
    assert METHODS.get("ccst").resolve({"reference_code": True})["style_images"] == 0
    assert METHODS.get("pardon").resolve({"reference_code": True})["style_images"] == 0
    assert METHODS.get("pardon").resolve({"reference_code": True, "style_images": 64})["style_images"] == 64


def test_pardon_clusters_the_sample_and_reports_its_size():
    sim = simulator("pardon", {"style_backend": "fft", "style_images": 12})
    info = sim.setup()
    assert info["style_images"] == 3 * 12 and info["augmented_images"] == 3 * PER_CLIENT


# -- the client styles' cache ---------------------------------------------------------------------------
def test_a_rerun_loads_the_client_styles_and_a_changed_recipe_or_damaged_file_computes_them(tmp_path, monkeypatch):
    encoded = []
    real = FakeTag.dataset_style
    monkeypatch.setattr(FakeTag, "dataset_style", lambda self, batches: encoded.append(1) or real(self, batches))
    hp = {"style_backend": "fake_tag", "k": 2, "style_images": 12}
    first = simulator("ccst", hp).setup()
    assert len(encoded) == 3 and "style_cache_hits" not in first and first["style_images"] == 3 * 12
    again = simulator("ccst", hp).setup()
    assert len(encoded) == 3 and again["style_cache_hits"] == 3 and again["style_images"] == 3 * 12
    assert "style_images_per_s" not in again  # nothing computed, no rate
    simulator("ccst", dict(hp, style_images=16)).setup()  # another sample: other images, computed
    assert len(encoded) == 6
    files = sorted((tmp_path / "cache" / "client_styles").glob("*.safetensors"))
    assert len(files) == 6
    for f in files:
        f.write_bytes(b"not a safetensors file")
    damaged = simulator("ccst", hp).setup()
    assert len(encoded) == 9 and "style_cache_hits" not in damaged  # computed again, and rewritten
    assert simulator("ccst", hp).setup()["style_cache_hits"] == 3


def test_pardon_reuses_its_clustered_styles_with_their_cluster_counts():
    first = simulator("pardon", {"style_backend": "fft"}).setup()
    again = simulator("pardon", {"style_backend": "fft"}).setup()
    assert again["style_cache_hits"] == 3 and again["style_clusters"] == first["style_clusters"]
    other = simulator("pardon", {"style_backend": "fft", "local_partition": "finest"}).setup()
    assert "style_cache_hits" not in other  # the partition is part of the recipe


# the read-only cache (a real read-only filesystem where the tests may mount one): tests/test_cache_faults.py
