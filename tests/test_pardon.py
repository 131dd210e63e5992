"""PARDON (pardon.txt Eq. 1-9): clustered client styles, the median interpolation style, the setup
exchange that broadcasts S_g only, the triplet loss and the feature regulariser, bad input.

Styles are checked by hand on an identity "encoder" (features = pixels in [0, 1]); the setup
exchange and runs use the fft backend (no networks, fast).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.paired_views import feature_regularizer, originals_batch_norm, paired_features, triplet_loss
from fedstyle.algorithms.pardon import PARDON, SERVER_CLUSTERS, VIEW
from fedstyle.data.client import ClientData
from fedstyle.data.transforms import BatchTransform
from fedstyle.errors import ConfigError
from fedstyle.federation.star import FederationSettings, StarSimulator
from fedstyle.models import build_model
from fedstyle.payload import payload_nbytes
from fedstyle.seeding import seed_everything
from fedstyle.style.transfer import TRANSFER_BACKENDS, FeatureAdaIN, Style
from fedstyle.style.transfer.feature_adain import ADAIN_EPS
from fedstyle.style.transfer.interpolation import (
    finch_partition,
    interpolation_style,
    local_style,
    median_style,
)
from tiny import interrupt_and_resume
from run_records import evaluations
from flower_grid import run_under_flower  # noqa: E402  (Flower's apps, messages over the wire, in process)

EPS_STD = math.sqrt(ADAIN_EPS)


class PixelAdaIN(FeatureAdaIN):
    """Identity encoder and decoder: styles are the channel moments of the pixels in [0, 1]."""

    name = "pixel"

    def __init__(self, device="cpu"):
        super().__init__(nn.Identity(), nn.Identity(), "identity", 1, "cpu", 128)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))


def flat_image(r: int, g: int, b: int) -> torch.Tensor:
    """A 2 x 2 uint8 image whose every pixel is (r, g, b)."""
    return torch.tensor([r, g, b], dtype=torch.uint8).view(1, 3, 1, 1).expand(1, 3, 2, 2).clone()


# -- client style: FINCH clusters, style over all pixels of each cluster, mean over clusters ----------------------
def two_cluster_client() -> torch.Tensor:
    """A client with two styles: 3 red images (R = .2, .4, .6) and 2 blue ones (B = .2, .8)."""
    red = [flat_image(v, 0, 0) for v in (51, 102, 153)]
    blue = [flat_image(0, 0, v) for v in (51, 204)]
    return torch.cat(red + blue)


@pytest.mark.parametrize("features", ["style", "flat"])
def test_client_style_is_the_mean_over_clusters(features):
    images = two_cluster_client()
    backend = PixelAdaIN()
    # FINCH (cosine) puts the red and the blue images apart: 3 and 2 members
    vectors = backend.image_styles(images)
    labels = finch_partition(torch.cat([vectors.tensors["mean"], vectors.tensors["std"]], 1), "coarsest")
    assert labels.tolist() == [0, 0, 0, 1, 1]
    local = local_style(backend, images, features=features, partition="coarsest", batch_size=2)
    assert local.clusters == 2 and local.images == 5
    # Eq. 2, red cluster over all 12 pixels: mu_R = .4, var_R = mean(.04, .16, .36) - .16 = .026667
    #        blue cluster over all 8 pixels: mu_B = .5, var_B = mean(.04, .64) - .25 = .09
    # client style = plain mean of the two cluster styles, not weighted by their sizes
    mean = torch.tensor([(0.4 + 0.0) / 2, 0.0, (0.0 + 0.5) / 2])
    std = torch.tensor([(math.sqrt(0.16 / 6 + ADAIN_EPS) + EPS_STD) / 2, EPS_STD,
                        (EPS_STD + math.sqrt(0.09 + ADAIN_EPS)) / 2])
    torch.testing.assert_close(local.style.tensors["mean"][0], mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(local.style.tensors["std"][0], std, atol=1e-6, rtol=1e-5)
    # the overall style of all pixels would let the bigger red cluster dominate
    overall = backend.dataset_style([images])
    assert float(overall.tensors["mean"][0, 0]) == pytest.approx(0.24, abs=1e-6)  # 3 * .4 / 5


def test_pooled_cluster_styles_equal_the_dataset_style_of_their_members():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (9, 3, 5, 4), dtype=torch.uint8, generator=g)
    groups = torch.tensor([0, 1, 0, 2, 1, 0, 2, 2, 2])
    fft = TRANSFER_BACKENDS.get("fft")(device="cpu")
    for backend in (PixelAdaIN(), fft):
        pooled = backend.pool_styles(backend.image_styles(images), groups)
        for j in range(3):
            direct = backend.dataset_style([images[groups == j]])
            for key, value in direct.tensors.items():
                torch.testing.assert_close(pooled.tensors[key][j], value[0], atol=1e-5, rtol=1e-5)


def test_clustering_fallbacks_do_not_crash():
    assert finch_partition(torch.rand(1, 6)).tolist() == [0]  # one image: one cluster
    assert finch_partition(torch.rand(2, 6)).tolist() == [0, 0]  # fewer than FINCH can split
    assert finch_partition(torch.ones(7, 6)).tolist() == [0] * 7  # identical styles
    rows = torch.cat([torch.rand(4, 6) + 1, torch.zeros(2, 6)])  # all-zero rows: cosine undefined
    labels = finch_partition(rows).tolist()
    assert labels[4] == labels[5] and labels[4] not in labels[:4]
    assert finch_partition(torch.zeros(3, 6)).tolist() == [0, 0, 0]
    separated = torch.cat([torch.tensor([[1.0, 0.0]]).repeat(3, 1), torch.tensor([[0.0, 1.0]]).repeat(3, 1)])
    assert finch_partition(separated, 1).tolist() == [0] * 6  # one requested cluster
    assert finch_partition(separated, 5).tolist() == [0, 0, 0, 1, 1, 1]  # more requested than FINCH finds
    backend = PixelAdaIN()
    one = local_style(backend, flat_image(10, 20, 30), batch_size=4)  # a client with a single image
    assert one.clusters == 1
    torch.testing.assert_close(one.style.tensors["mean"], backend.image_styles(flat_image(10, 20, 30)).tensors["mean"])


# -- S_g: FINCH on the client styles, cluster means, element-wise median -------------------------------------------
def styles(rows) -> Style:
    t = torch.tensor(rows, dtype=torch.float32)
    return Style("pixel", "identity", {"mean": t[:, :2], "std": t[:, 2:]})


def test_median_of_odd_and_even_counts():
    odd = styles([[1, 5, 9, 0], [3, 4, 7, 2], [2, 6, 8, 1]])
    m = median_style(odd)
    assert m.tensors["mean"].tolist() == [[2, 5]] and m.tensors["std"].tolist() == [[8, 1]]
    assert median_style(odd, "lower").tensors["mean"].tolist() == [[2, 5]]  # odd: one rule
    even = styles([[1, 5, 9, 0], [3, 4, 7, 2], [2, 6, 8, 1], [10, 0, 0, 4]])
    assert median_style(even).tensors["mean"].tolist() == [[2.5, 4.5]]  # mean of the two middle values
    assert median_style(even).tensors["std"].tolist() == [[7.5, 1.5]]
    assert median_style(even, "lower").tensors["mean"].tolist() == [[2, 4]]  # the code's lower median
    assert median_style(even, "lower").tensors["std"].tolist() == [[7, 1]]


def test_interpolation_style_is_the_median_of_cluster_means():
    # four groups of two clients, each group along its own direction; FINCH's finest partition pairs them
    rows = []
    for direction in ([1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]):
        base = torch.tensor(direction, dtype=torch.float32) * 4 + 1
        rows += [base.tolist(), (base * 1.5).tolist()]  # same direction, another scale: mutual first neighbours
    client_styles = styles(rows)
    s_g, labels = interpolation_style(client_styles, partition="finest", median="midpoint")
    assert labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # cluster means (Eq. 4): 1.25 * (4 e_k + 1); each element's four values are 1.25 x {5, 1, 1, 1}
    expected = torch.full((1, 4), 1.25)  # even count: mean of the two middle values 1.25 and 1.25
    torch.testing.assert_close(torch.cat([s_g.tensors["mean"], s_g.tensors["std"]], 1), expected)
    # an odd number of clusters: three groups
    three = styles(rows[:6])
    s_g, labels = interpolation_style(three, partition="finest", median="lower")
    assert labels.max() == 2
    torch.testing.assert_close(torch.cat([s_g.tensors["mean"], s_g.tensors["std"]], 1), torch.full((1, 4), 1.25))


# -- the setup exchange -----------------------------------------------------------------------------------------------
SIZE = 16


def make_clients(n=3, per_client=20, classes=4, augment="none"):
    g = torch.Generator().manual_seed(0)
    transform = BatchTransform((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), augment)
    clients = []
    for c in range(n):
        tint = torch.tensor([1.0 if k == c % 3 else 0.3 for k in range(3)]).view(1, 3, 1, 1)
        labels = torch.arange(per_client) % classes
        base = (labels * 50 + 30).view(-1, 1, 1, 1).float()
        noise = torch.randint(0, 40, (per_client, 3, SIZE, SIZE), generator=g).float()
        images = ((base + noise) * tint).clamp(0, 255).to(torch.uint8)
        clients.append(ClientData(images, labels, torch.full((per_client,), c), transform))
    return clients


def simulator(hp=None, clients=None, rounds=1):
    seed_everything(0)
    clients = clients if clients is not None else make_clients()
    model = build_model("convnet", 4, SIZE)
    # stylize=eager: the setup makes (and counts) every transfer; the lazy default is tested against it below
    algo = PARDON({"style_backend": "fft", "stylize": "eager", **(hp or {})}, num_classes=4, num_clients=len(clients))
    algo.configure_model(model)
    settings = FederationSettings(rounds=rounds, lr=0.05, batch_size=8, local_steps=2)
    return StarSimulator(algo, model, clients, settings, seed=0, device=torch.device("cpu"))


def test_the_broadcast_holds_only_the_global_style():
    sim = simulator(clients=make_clients(n=5))
    received = {}
    original = sim.algo.setup_download

    def spy(ctx, model, broadcast):
        received[ctx.client_id] = dict(broadcast)
        return original(ctx, model, broadcast)

    sim.algo.setup_download = spy
    uploads = {c: sim.algo.setup_upload(sim.context(c, -1, "setup"), sim.model) for c in range(5)}
    info = sim.setup()
    assert sorted(received) == list(range(5))
    expected, _ = interpolation_style(Style.concat([Style.from_payload(uploads[c]) for c in range(5)]))
    for payload in received.values():
        assert set(payload) == {"style/backend", "style/encoder", "style/tensor/amplitude"}  # one style, nothing else
        s_g = Style.from_payload(payload)
        assert len(s_g) == 1
        torch.testing.assert_close(s_g.tensors["amplitude"], expected.tensors["amplitude"])
        for other in uploads.values():  # no client's own style travels down
            assert not torch.equal(s_g.tensors["amplitude"], other["style/tensor/amplitude"])
    assert set(sim.server.state) == {SERVER_CLUSTERS}  # the server keeps no client style either
    one_up = payload_nbytes(uploads[0])
    assert info["setup_bytes_up"] == 5 * one_up and info["setup_bytes_down"] == 5 * one_up  # one style each way
    assert info["style_images"] == 5 * 20 and info["augmented_images"] == 5 * 20
    # the uploads above filled the style cache: the setup loaded every client's style (no rate) and transferred
    assert info["style_cache_hits"] == 5 and "style_images_per_s" not in info
    assert info["stylized_images_per_s"] > 0 and info["style_clusters"] >= 5


def test_each_image_is_transferred_to_sg_once_and_rides_along_aligned():
    sim = simulator(clients=make_clients(augment="crop_flip"))
    sim.setup()
    backend = sim.algo.backend(sim.context(0, -1, "setup"))
    received = Style.from_payload(sim.algo.setup_broadcast(
        {c: sim.algo.setup_upload(sim.context(c, -1, "setup"), sim.model) for c in range(3)}, sim.server))
    for data in sim.clients:
        assert torch.equal(data.views[VIEW], backend.transfer(data.images, received))
    # the same crop and flip cut x and x': training batches of a view built from the images themselves match
    data = sim.clients[0]
    data.set_view(VIEW, data.images.clone())
    for x, _, _, views in data.batches(8, torch.Generator().manual_seed(3), torch.device("cpu"), 3, views=True):
        assert torch.equal(x, views[VIEW])
    again = simulator().setup()  # a second run reuses the cached transfers
    assert again["cache_hits"] == 3


def test_training_logs_each_loss_term_and_aggregates_by_size():
    from fedstyle.algorithms.base import Algorithm

    sim = simulator()
    sim.setup()
    result = sim.run_round(0)
    assert {"ce", "triplet", "reg"} <= set(result.metrics)
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert type(sim.algo).aggregate is Algorithm.aggregate and sim.algo.hp["aggregation"] == "size"  # FedAvg by size


# -- Eq. 7 and Eq. 8 by hand ---------------------------------------------------------------------------------------
def test_triplet_loss_by_hand_on_four_samples():
    z = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    zp = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 0.0], [2.0, 1.0]])
    y = torch.tensor([0, 0, 1, 1])
    # anchor 0: pos |(0,0)-(0,1)|^2 = 1; negatives zp2, zp3: 0 and 5 -> mean 2.5; [1 - 2.5 + 3]+ = 1.5
    # anchor 1: pos 0; negatives |(1,0)-(0,0)|^2 = 1, |(1,0)-(2,1)|^2 = 2 -> 1.5; [0 - 1.5 + 3]+ = 1.5
    # anchor 2: pos 4; negatives |(0,2)-(0,1)|^2 = 1, |(0,2)-(1,0)|^2 = 5 -> 3; [4 - 3 + 3]+ = 4
    # anchor 3: pos 1; negatives |(1,1)-(0,1)|^2 = 1, |(1,1)-(1,0)|^2 = 1 -> 1; [1 - 1 + 3]+ = 3
    assert float(triplet_loss(z, zp, y, margin=3.0, reduction="sum")) == pytest.approx(10.0)
    assert float(triplet_loss(z, zp, y, margin=3.0)) == pytest.approx(2.5)
    # margin 0: anchors 0, 1 and 3 give 1 - 2.5, 0 - 1.5 and 1 - 1, clipped to 0; anchor 2 gives 4 - 3 = 1
    assert float(triplet_loss(z, zp, y, margin=0.0, reduction="sum")) == pytest.approx(1.0)


def test_triplet_loss_is_zero_when_positives_coincide_and_negatives_are_far():
    z = torch.tensor([[0.0, 0.0], [0.1, 0.0], [10.0, 10.0], [10.0, 10.1]])
    y = torch.tensor([0, 0, 1, 1])
    for negatives in ("mean", "random"):
        for distance in ("squared", "euclidean"):
            loss = triplet_loss(z, z.clone(), y, margin=0.3, negatives=negatives, distance=distance)
            assert float(loss) == 0.0
    # anchors without any negative (one class in the batch) form no triplet
    assert float(triplet_loss(z, z + 1, torch.zeros(4, dtype=torch.long), margin=0.3)) == 0.0


def test_reference_triplet_equals_torch_triplet_margin_loss():
    g = torch.Generator().manual_seed(0)
    z, zp = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)
    y = torch.tensor([0, 1])  # one negative per anchor: the random pick is forced
    ours = triplet_loss(z, zp, y, margin=0.3, negatives="random", distance="euclidean", normalize=True)
    a, p = nn.functional.normalize(z, dim=1), nn.functional.normalize(zp, dim=1)
    torch.testing.assert_close(ours, nn.TripletMarginLoss(margin=0.3)(a, p, p[[1, 0]]))


def test_feature_regularizer_by_hand():
    z = torch.tensor([[1.0, 2.0], [0.0, 1.0]])
    zp = torch.tensor([[1.0, 0.0], [2.0, 2.0]])
    # Eq. 8: (1 + 4 + 0 + 1) + (1 + 0 + 4 + 4) = 15
    assert float(feature_regularizer(z, zp, reduction="sum")) == 15.0
    assert float(feature_regularizer(z, zp)) == 7.5  # over the batch of 2
    assert float(feature_regularizer(z, zp, scale="element")) == 3.75  # and the 2 feature dimensions


# -- options and bad input ------------------------------------------------------------------------------------------
def test_reference_code_sets_the_public_codes_choices_unless_given():
    hp = PARDON.resolve({"reference_code": True, "margin": 1.0})
    assert (hp["negatives"], hp["normalize"], hp["distance"], hp["ce_views"], hp["reg_scale"]) == \
        ("random", True, "euclidean", "original", "element")
    assert (hp["hinge"], hp["batchnorm_stats"]) == (True, "frozen")  # TripletMarginLoss; its frozen BatchNorm
    assert (hp["transfer_alpha"], hp["server_partition"], hp["median"], hp["local_features"]) == \
        (0.5, "finest", "lower", "flat")
    assert hp["margin"] == 1.0  # given explicitly: kept
    assert PARDON.resolve({"reference_code": True, "style_backend": "fft"})["local_features"] == "style"
    assert PARDON.resolve({"local_partition": "3"})["local_partition"] == "3"
    defaults = PARDON.resolve({})  # the code's normalised Euclidean triplet with Eq. 7's mean negative, L_reg on
    assert (defaults["normalize"], defaults["reg_scale"], defaults["distance"], defaults["negatives"]) == \
        (True, "element", "euclidean", "mean")  # the code's scale
    # L_CE on the originals (Sec. III-B), whose BatchNorm statistics the transfers do not touch
    assert (defaults["ce_views"], defaults["batchnorm_stats"], defaults["hinge"]) == ("original", "originals", True)


@pytest.mark.parametrize("given,message", [
    ({"gamma1": -0.5}, "gamma1.*below the minimum 0.0"),
    ({"style_backend": "vgg"}, "'vgg' is not a style backend; choose one of"),
    ({"style_backend": "adain"}, "needs the public AdaIN weights vgg_normalised.pth.*vgg_weights=PATH"),
    ({"style_backend": "adain", "vgg_weights": "/nowhere/vgg.pth", "decoder_weights": "/nowhere/d.pth"},
     "vgg_weights=/nowhere/vgg.pth does not exist"),
    ({"server_partition": "middle"}, "not a FINCH partition; choose finest, coarsest or a number"),
    ({"style_backend": "fft", "local_features": "flat"}, "fft backend has none"),
    ({"band": 0.2}, "band is an option of the fft backend"),
])
def test_bad_input_is_one_line_naming_the_fix(given, message):
    with pytest.raises(ConfigError, match=message) as err:
        METHODS.get("pardon")(given, num_classes=4, num_clients=3)
    assert "\n" not in str(err.value)


def test_bad_input_fails_before_the_run_directory_is_written(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="AdaIN weights"):
        from fedstyle.experiments.runner import run_experiment

        run_experiment(tiny_config.updated(method="pardon", hparams={"style_backend": "adain"}), tmp_path / "r")
    assert not (tmp_path / "r").exists()


# -- runtimes --------------------------------------------------------------------------------------------------------
def test_pardon_under_flower_equals_the_simulator(tiny_config, tmp_path):
    """The setup exchange (style up, S_g down, local transfer) and the paired training through Flower's
    ServerApp and ClientApp (tests/flower_grid.py) give the in-process simulator's metrics and weights bitwise."""
    pytest.importorskip("flwr", reason="Flower's apps need fedstyle[flower]")
    import json

    from safetensors.torch import load_file

    from fedstyle.experiments.runner import run_experiment

    def setup_bytes(run_dir):
        setup = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
        return setup["setup_bytes_up"], setup["setup_bytes_down"], setup["style_images"]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a site trains (one thread per ClientApp)
    try:
        config = tiny_config.updated(method="pardon", hparams={"style_backend": "fft"}, partition="per_domain",
                                     clients=6, clients_per_round=4, lr_schedule="constant")
        run_experiment(config, tmp_path / "sim", quiet=True)
        run_under_flower(config, tmp_path / "flower")
    finally:
        torch.set_num_threads(threads)
    assert evaluations(tmp_path / "flower") == evaluations(tmp_path / "sim")  # accuracies, losses, loss terms, bytes
    assert setup_bytes(tmp_path / "flower") == setup_bytes(tmp_path / "sim")
    a = load_file(str(tmp_path / "sim" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "flower" / "checkpoint.safetensors"))
    globals_a = {k: v for k, v in a.items() if k.startswith("global/")}
    assert globals_a and all(torch.equal(v, b[k]) for k, v in globals_a.items())


def test_resumed_run_equals_uninterrupted(tiny_config, tmp_path, monkeypatch):
    """The setup exchange (S_g) and the restyled cache come back from the checkpoint on resume."""
    from fedstyle.experiments.runner import run_experiment

    config = tiny_config.updated(method="pardon", hparams={"style_backend": "fft"}, rounds=3, partition="per_domain",
                                 clients=6, clients_per_round=4)
    run_experiment(config, tmp_path / "full", quiet=True)
    interrupt_and_resume(config, tmp_path / "cut", monkeypatch, at_round=2)
    assert len(evaluations(tmp_path / "full")) == 3
    assert evaluations(tmp_path / "cut") == evaluations(tmp_path / "full")


# -- BatchNorm in the forward of [x; x'] (batchnorm_stats) -------------------------------------------------------------
def bn_states(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()
            if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}


def pair_features(model: nn.Module, x: torch.Tensor, xp: torch.Tensor, mode: str) -> torch.Tensor:
    algo = PARDON({"style_backend": "fft", "batchnorm_stats": mode}, num_classes=4, num_clients=1)
    return paired_features(model, x, xp, algo.hp["batchnorm_stats"])[2]  # [z; z^p], as PARDON's pair_loss


@pytest.mark.parametrize("backbone,size", [("convnet", 16), ("cnn_digitsdg", 16), ("resnet18", 32),
                                           ("efficientnet_lite0", 32)])
def test_transfers_change_neither_the_originals_features_nor_the_running_statistics(backbone, size):
    """batchnorm_stats=originals: x's features and the running statistics after the forward of [x; x'] are
    those of a forward of x alone, on backbones with BatchNorm (ConvNet, ResNet, EfficientNet) and without."""
    torch.manual_seed(0)
    model = build_model(backbone, 4, size).train()
    for block in model.modules():  # EfficientNet's stochastic depth draws per row: not what is compared here
        if hasattr(block, "drop_rate"):
            block.drop_rate = 0.0
    x, xp = torch.randn(6, 3, size, size), 3.0 * torch.randn(6, 3, size, size) + 2.0  # x' of another style
    alone = copy_model(model)
    with torch.no_grad():
        expected = alone.features(x)
        z_all = pair_features(model, x, xp, "originals")
    torch.testing.assert_close(z_all[:6], expected, rtol=1e-5, atol=1e-5)
    after, reference = bn_states(model), bn_states(alone)
    assert after.keys() == reference.keys() and (backbone == "cnn_digitsdg") == (not after)
    for key, value in reference.items():
        torch.testing.assert_close(after[key], value, rtol=1e-6, atol=1e-7)
    assert all(type(m).forward is m.forward.__func__ for m in model.modules())  # the layers' forward restored
    if after:  # the old joint batch mixes x' into both: the checks above can fail
        joint = copy_model(alone)
        with torch.no_grad():
            z_joint = pair_features(joint, x, xp, "joint")
        assert (z_joint[:6] - expected).abs().max() > 1e-2
        assert any(not torch.allclose(v, reference[k]) for k, v in bn_states(joint).items() if "running" in k)


def copy_model(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model)


def test_transfers_are_normalised_with_the_originals_batch_statistics_by_hand():
    """One BatchNorm layer, one channel: x = (1, 3) has mean 2 and biased variance 1, so x' = (4, 0) gives
    ((4 - 2) / 1, (0 - 2) / 1) * weight + bias; x keeps (-1, 1); the running mean moves to 0.9 * 0 + 0.1 * 2
    and the running variance (unbiased, n = 2: 2) to 0.9 * 1 + 0.1 * 2, as after x alone."""
    layer = nn.BatchNorm1d(1, eps=1e-12)
    with torch.no_grad():
        layer.weight.fill_(2.0)
        layer.bias.fill_(0.5)
    batch = torch.tensor([[1.0], [3.0], [4.0], [0.0]], requires_grad=True)
    with originals_batch_norm(layer, 2):
        out = layer(batch)
    torch.testing.assert_close(out.detach(), torch.tensor([[-1.5], [2.5], [4.5], [-3.5]]))
    torch.testing.assert_close(layer.running_mean, torch.tensor([0.2]))
    torch.testing.assert_close(layer.running_var, torch.tensor([1.1]))
    assert int(layer.num_batches_tracked) == 1
    # the transfers' outputs depend on x through its statistics: their loss reaches x's gradient
    out[2:].sum().backward()
    assert batch.grad[:2].abs().sum() > 0
    layer.eval()  # eval mode: the running statistics, as without the block
    with originals_batch_norm(layer, 2):
        torch.testing.assert_close(layer(batch), nn.functional.batch_norm(
            batch, layer.running_mean, layer.running_var, layer.weight, layer.bias, eps=1e-12))


def test_frozen_batch_norm_uses_and_keeps_the_running_statistics():
    torch.manual_seed(0)
    model = build_model("convnet", 4, SIZE).train()
    model.backbone.layer1[1].running_mean.fill_(0.3)  # not the identity statistics of a fresh layer
    before = bn_states(model)
    x, xp = torch.randn(4, 3, SIZE, SIZE), torch.randn(4, 3, SIZE, SIZE)
    with torch.no_grad():
        z_all = pair_features(model, x, xp, "frozen")
        expected = model.eval().features(torch.cat([x, xp]))
    model.train()
    torch.testing.assert_close(z_all, expected)
    assert all(torch.equal(v, before[k]) for k, v in bn_states(model).items())
    assert all(m.training for m in model.modules())  # modes restored


def test_a_training_step_moves_the_running_statistics_as_a_step_on_the_originals_alone():
    """pair_loss with the defaults: after one forward/backward/step the BatchNorm buffers equal those of a
    CE step on x alone (the transfers enter the loss, not the statistics)."""
    class Ctx:
        def log(self, name, value):
            pass

    torch.manual_seed(0)
    model = build_model("convnet", 4, SIZE).train()
    alone = copy_model(model)
    x, xp, y = torch.randn(8, 3, SIZE, SIZE), torch.randn(8, 3, SIZE, SIZE) * 2, torch.arange(8) % 4
    algo = PARDON({"style_backend": "fft"}, num_classes=4, num_clients=1)
    assert (algo.hp["ce_views"], algo.hp["batchnorm_stats"]) == ("original", "originals")
    for net, loss_fn in ((model, lambda: algo.pair_loss(Ctx(), model, x, xp, y)),
                         (alone, lambda: nn.functional.cross_entropy(alone(x), y))):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        optimizer.zero_grad()
        loss_fn().backward()
        optimizer.step()
    for key, value in bn_states(alone).items():
        torch.testing.assert_close(bn_states(model)[key], value, rtol=1e-6, atol=1e-7)


# -- Eq. 7's distance, margin and hinge on a trained model ---------------------------------------------------------------
def test_margin_is_on_the_euclidean_distance_it_was_chosen_for():
    """Unit features, anchor 0 at |z - z^p| = 0.5 from its positive and 0.75 from its negative: the public
    code's margin 0.3 on the Euclidean distance is not met (0.5 - 0.75 + 0.3 = 0.05), on the squared
    distance it is (0.25 - 0.5625 + 0.3 = -0.0125): the default is the distance the margin was chosen for.
    Anchor 1 coincides with its positive and lies far from its negative: 0 either way."""
    def on_circle(d):  # the unit vector at Euclidean distance d from (1, 0), above (d > 0) or below (d < 0)
        angle = 2 * math.asin(abs(d) / 2)
        return [math.cos(angle), math.copysign(math.sin(angle), d)]

    z = torch.tensor([on_circle(0.0), on_circle(-0.75)])
    zp = torch.tensor([on_circle(0.5), on_circle(-0.75)])
    y = torch.tensor([0, 1])
    hp = PARDON.resolve({})
    assert (hp["distance"], hp["margin"], hp["normalize"], hp["hinge"]) == ("euclidean", 0.3, True, True)
    assert float(triplet_loss(z, zp, y, margin=0.3, distance="euclidean", reduction="sum")) == pytest.approx(0.05, abs=1e-5)
    assert float(triplet_loss(z, zp, y, margin=0.3, distance="squared", reduction="sum")) == 0.0
    # Eq. 7 as printed, no [.]_+: anchor 0 gives -0.0125 and anchor 1 0 - 1.1860^2 + 0.3 (|z_1 - z_0^p| =
    # 2 sin((angle(0.5) + angle(0.75)) / 2)) on the squared distance
    far = 2 * math.sin((2 * math.asin(0.25) + 2 * math.asin(0.375)) / 2)
    unclipped = triplet_loss(z, zp, y, margin=0.3, distance="squared", reduction="sum", hinge=False)
    assert float(unclipped) == pytest.approx(-0.0125 + 0.3 - far ** 2, abs=1e-6)


def synthetic_pairs(n=64, classes=4, seed=0):
    """Images of 4 classes (a bright square in one of four quadrants on noise) and their transfers to
    another "style" (inverted colours, lower contrast), normalised like model inputs."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    x = torch.rand(n, 3, SIZE, SIZE, generator=g) * 0.5
    for i, label in enumerate(y.tolist()):
        r, c = divmod(label, 2)
        x[i, :, r * 8 : r * 8 + 8, c * 8 : c * 8 + 8] += 0.5
    xp = 1.0 - 0.6 * x + 0.1 * torch.rand(n, 3, SIZE, SIZE, generator=g)
    return (x - 0.5) / 0.5, (xp - 0.5) / 0.5, y


class LogOnly:
    def log(self, name, value):
        pass


def test_triplet_has_a_gradient_on_a_trained_model():
    """After 40 steps of PARDON's loss with the defaults the model classifies the training pairs, and the
    triplet term still has a value and a gradient (the old squared distance with margin 0.3 is met by then)."""
    torch.manual_seed(0)
    x, xp, y = synthetic_pairs()
    model = build_model("convnet", 4, SIZE).train()
    algo = PARDON({"style_backend": "fft"}, num_classes=4, num_clients=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(40):
        rows = torch.randperm(len(y))[:16]
        loss = algo.pair_loss(LogOnly(), model, x[rows], xp[rows], y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with originals_batch_norm(model, len(y)):
        z_all = model.features(torch.cat([x, xp]))
    z, zp = z_all[: len(y)], z_all[len(y):]
    assert (model.head(z).argmax(1) == y).float().mean() > 0.9  # trained
    hp = algo.hp
    triplet = triplet_loss(z, zp, y, margin=hp["margin"], distance=hp["distance"], normalize=hp["normalize"])
    model.zero_grad()
    triplet.backward()
    grad = torch.sqrt(sum(p.grad.square().sum() for p in model.parameters() if p.grad is not None))
    assert float(triplet.detach()) > 0.005 and float(grad) > 0  # measured: 0.037 and 1.07
    squared = triplet_loss(z.detach(), zp.detach(), y, margin=0.3, distance="squared", normalize=True)
    assert float(squared) < 0.005  # measured: 0 — the margin 0.3 on the squared distance is met: no gradient


@pytest.mark.parametrize("affine", [True, False])
def test_transfers_normalisation_and_its_gradients_match_the_explicit_formula_in_float64(affine):
    """The passengers' one-pass scale and shift (addcmul) against (x' - mean) / sqrt(var + eps) * w + b written out,
    with mean and var those of x: outputs and the gradients of x, x', weight and bias, in float64."""
    torch.manual_seed(0)
    layer = nn.BatchNorm2d(3, affine=affine).double().train()
    if affine:
        with torch.no_grad():
            layer.weight.uniform_(0.5, 2.0)
            layer.bias.uniform_(-1.0, 1.0)
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    xp = (3.0 * torch.randn(4, 3, 5, 5, dtype=torch.float64) + 2.0).requires_grad_()
    probe = torch.randn(8, 3, 5, 5, dtype=torch.float64)
    with originals_batch_norm(layer, 4):
        out = layer(torch.cat([x, xp]))
    params = [layer.weight, layer.bias] if affine else []
    got = torch.autograd.grad((out * probe).sum(), [x, xp, *params])
    var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=False, keepdim=True)
    scale = lambda t: (t - mean) / torch.sqrt(var + layer.eps)  # noqa: E731
    expected = torch.cat([scale(x), scale(xp)])
    if affine:
        expected = expected * layer.weight.view(1, -1, 1, 1) + layer.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    want = torch.autograd.grad((expected * probe).sum(), [x, xp, *params])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
