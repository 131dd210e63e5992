"""FedGMA (baselines notes §4): the sign-agreement mask on three hand-made updates."""

from __future__ import annotations

import pytest
import torch

from fedstyle.algorithms.context import ClientUpdate, ServerContext
from fedstyle.algorithms.fedgma import FedGMA, masked_update

# three clients' new weights of a 4-element parameter around w^t = 0; sizes 1, 1, 2
BASE = torch.zeros(4)
UPDATES = [torch.tensor([1.0, 1.0, -1.0, 0.0]), torch.tensor([2.0, -1.0, -1.0, 0.0]), torch.tensor([3.0, 1.0, 1.0, 0.0])]
SIZES = [1, 1, 2]
P = [0.25, 0.25, 0.5]
# averaged update: [.25 + .5 + 1.5, .25 - .25 + .5, -.25 - .25 + .5, 0] = [2.25, .5, 0, 0]
# uniform sign agreement |sum sign / 3|: [1, 1/3, 1/3, 0]; size-weighted |sum p sign|: [1, .5, 0, 0]


@pytest.mark.parametrize("tau,sign_coefs,reference,expected", [
    (0.4, [1 / 3] * 3, False, [2.25, 0.5 / 3, 0.0, 0.0]),  # soft mask: disagreeing coordinates scaled by A
    (0.4, P, False, [2.25, 0.5, 0.0, 0.0]),  # size-weighted agreement .5 >= tau keeps coordinate 2
    (0.0, [1 / 3] * 3, False, [2.25, 0.5, 0.0, 0.0]),  # tau = 0: FedAvg
    (0.4, [1 / 3] * 3, True, [4.5, 0.0, 0.0, 0.0]),  # benchmark / PARDON rule: 1[A >= tau] (1 + A)
])
def test_mask_on_three_hand_made_updates(tau, sign_coefs, reference, expected):
    out = masked_update(BASE, UPDATES, P, sign_coefs, tau, reference=reference)
    torch.testing.assert_close(out, torch.tensor(expected))


def test_server_lr_scales_the_masked_update_around_the_old_weights():
    base = torch.ones(4)
    out = masked_update(base, [u + 1 for u in UPDATES], P, [1 / 3] * 3, 0.4, server_lr=0.5)
    torch.testing.assert_close(out, 1 + 0.5 * torch.tensor([2.25, 0.5 / 3, 0.0, 0.0]))


def test_aggregate_masks_parameters_and_averages_buffers_plainly():
    algo = FedGMA({"tau": 0.4}, num_classes=2, num_clients=3)
    algo.param_keys = ["w"]
    server = ServerContext(weights={"w": BASE.clone(), "bn.running_mean": torch.zeros(4),
                                    "bn.num_batches_tracked": torch.tensor(0)}, state={}, round=0, num_clients=3, seed=0)
    updates = [ClientUpdate(i, {"w": u, "bn.running_mean": u * 10, "bn.num_batches_tracked": torch.tensor(4 * (i + 1))},
                            n, 0.0) for i, (u, n) in enumerate(zip(UPDATES, SIZES))]
    out = algo.aggregate(server, updates)
    torch.testing.assert_close(out["w"], torch.tensor([2.25, 0.5 / 3, 0.0, 0.0]))
    torch.testing.assert_close(out["bn.running_mean"], torch.tensor([22.5, 5.0, 0.0, 0.0]))  # size-weighted mean
    assert int(out["bn.num_batches_tracked"]) == 9  # .25 * 4 + .25 * 8 + .5 * 12
    uniform = FedGMA({"tau": 0.4, "aggregation": "uniform"}, num_classes=2, num_clients=3)
    uniform.param_keys = ["w"]
    # equal weights: averaged update [2, 1/3, -1/3, 0], agreement [1, 1/3, 1/3, 0]
    torch.testing.assert_close(uniform.aggregate(server, updates)["w"], torch.tensor([2.0, 1 / 9, -1 / 9, 0.0]))


def test_tau_out_of_range_is_refused():
    from fedstyle.errors import ConfigError

    with pytest.raises(ConfigError, match="tau.*above the maximum"):
        FedGMA({"tau": 1.5}, num_classes=2, num_clients=3)
