"""benchmarks/stablefdg_exploration.py's recorder: what Eq. 4-5 (alpha = 3) does to each sample-channel, counted
against values worked out by hand, and the firing stage's output left as the method makes it."""

import math

import pytest
import torch

from bench_scripts import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("stablefdg_exploration.py")


def _batch(last: list[float]) -> torch.Tensor:
    """4 samples x 1 channel x 2 x 2: three maps (0, 2, 0, 2) (mu 1, sigma ~1) and ``last``."""
    rows = [[0.0, 2.0, 0.0, 2.0]] * 3 + [last]
    return torch.tensor(rows).view(4, 1, 2, 2)


def test_a_near_constant_explored_map_is_scaled_over_a_thousand_times_and_inverted(script):
    calls = []
    recorder = script.FiringStageRecorder(lambda x, start, alpha, **kw: calls.append((start, alpha, kw)) or x)
    x = _batch([0.0, 0.002, 0.0, 0.002])  # mu 0.001, variance 1e-6: sigma = sqrt(1e-6 + 1e-6)
    out = recorder(x, 2, 3.0, center_count=None)
    assert out is x and calls == [(2, 3.0, {"center_count": None})]  # the method's own call, unchanged
    row = recorder.sums[0]
    # by hand: sigma = (1, 1, 1, 0.0014142) (each + 1e-6 inside the root), batch mean 0.750354; the last is
    # 0.19 % of it (under 10 % and 1 %); explored: samples 2 and 3, sigma_e = 1 + 3 (1 - 0.750354) = 1.7489
    # (scale 1.75) and 0.0014142 + 3 (0.0014142 - 0.750354) = -2.24540 (scale 1587.7, contrast inverted)
    assert (row["calls"], row["channels"], row["constant"]) == (1, 4, 0)
    assert (row["below_10pct"], row["below_1pct"]) == (1, 1)
    assert (row["explored"], row["explored_varying"]) == (2, 2)
    assert (row["scale_over_10"], row["scale_over_100"], row["negative"]) == (1, 1, 1)
    assert (row["explored_samples"], row["samples_over_10"], row["samples_over_100"]) == (2, 1, 1)
    sigma_last = math.sqrt(2e-6)
    centre = (3 * math.sqrt(1 + 1e-6) + sigma_last) / 4
    assert recorder.largest[0] == pytest.approx(abs(4 * sigma_last - 3 * centre) / sigma_last, rel=1e-4)
    assert recorder.largest[0] == pytest.approx(1587.7, rel=1e-4)


def test_a_constant_map_counts_as_constant_not_as_scaled(script):
    recorder = script.FiringStageRecorder(lambda x, start, alpha, **kw: x)
    recorder(_batch([0.0, 0.0, 0.0, 0.0]), 2, 3.0)  # AdaIN maps it to the constant mu_e whatever the scale
    row = recorder.sums[0]
    assert (row["constant"], row["below_10pct"], row["explored"], row["explored_varying"]) == (1, 0, 2, 1)
    assert (row["scale_over_10"], row["negative"]) == (0, 1)  # sigma_e = 0.001 + 3 (0.001 - 0.75025) < 0
    assert (row["explored_samples"], row["samples_over_10"]) == (2, 0)
    recorder(_batch([0.0] * 4), None, 3.0)  # no exploration this call (MixStyle only): nothing counted
    assert recorder.sums[0]["calls"] == 1
