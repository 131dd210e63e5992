"""Batched augmentations (fedstyle.data.augment): RandConv, AugMix as tensor ops, texture corruption and
the style-complement module — identities, hand values, PIL's reference operations, seeds, ranges, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from fedstyle.data.augment import (AugMix, BATCH_AUGMENTATIONS, Draws, RandConv, StyleComplement, TextureCorruption,
                                   apply_groups, build_augmentation, parse_options)
from fedstyle.data.augment import augmix as ops
from fedstyle.data.augment.texture import gaussian_blur
from fedstyle.errors import ConfigError

MEAN, STD = (0.5, 0.4, 0.3), (0.5, 0.25, 0.2)


def images(n=6, h=32, w=32, seed=0) -> torch.Tensor:
    """A normalised batch of real-looking images (uint8 pixels, then (x / 255 - mean) / std)."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (n, 3, h, w), generator=g).float() / 255
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    return (pixels - mean) / std


def bounds():
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    return -mean / std, (1 - mean) / std


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# -- RandConv --------------------------------------------------------------------------------------
@pytest.mark.parametrize("per_sample", [False, True])
def test_randconv_with_kernel_1_and_mixing_weight_0_is_the_identity(per_sample):
    x = images()
    rc = RandConv(MEAN, STD, kernel_sizes=(1,), mix_low=0.0, mix_high=0.0, per_sample=per_sample)
    assert torch.equal(rc(x, gen()), x)


def test_randconv_1x1_without_mixing_is_the_hand_computed_channel_mix():
    x = images(n=2)
    rc = RandConv(MEAN, STD, kernel_sizes=(1,), mix=False, clamp=False)
    out = rc(x, gen(3))
    g = gen(3)
    torch.randint(0, 1, (), generator=g)  # the kernel-size draw
    w = torch.randn((3, 3, 1, 1), generator=g) / math.sqrt(3 * 1 * 1)  # N(0, 1 / (C_in k^2))
    expected = torch.einsum("oc,bchw->bohw", w[:, :, 0, 0], x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_randconv_weights_have_variance_one_over_fan_in_and_kernel_sizes_are_drawn():
    rc = RandConv(MEAN, STD, kernel_sizes=(7,))
    draws = Draws(torch.zeros(1), gen(0))
    w = rc.sample_weights(draws, filters=200, channels=3)
    assert w.shape == (600, 3, 7, 7)
    assert w.std().item() == pytest.approx(1 / math.sqrt(3 * 49), rel=0.03)
    rc = RandConv(MEAN, STD)
    sizes = {rc.sample_weights(Draws(torch.zeros(1), gen(s)), 1, 3).shape[-1] for s in range(40)}
    assert sizes == {1, 3, 5, 7}


def test_randconv_per_sample_filters_differ_per_sample_and_a_batch_filter_does_not():
    x = images(n=2)
    x = torch.cat([x[:1], x[:1]])  # two identical images
    shared = RandConv(MEAN, STD, kernel_sizes=(3,))(x, gen(1))
    own = RandConv(MEAN, STD, kernel_sizes=(3,), per_sample=True)(x, gen(1))
    assert torch.equal(shared[0], shared[1])
    assert not torch.allclose(own[0], own[1])


# -- AugMix operations against PIL -----------------------------------------------------------------
def _uint8_image(seed=0, h=20, w=24, low=0, high=256):
    rng = np.random.default_rng(seed)
    return rng.integers(low, high, (h, w, 3), dtype=np.uint8)


def _as_batch(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a).permute(2, 0, 1)[None].float() / 255


def _as_uint8(v: torch.Tensor) -> np.ndarray:
    return (v[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()


@pytest.mark.parametrize("low,high", [(0, 256), (40, 90), (100, 101)])
def test_equalize_matches_pil(low, high):
    a = _uint8_image(low=low, high=high)
    ours = _as_uint8(ops.equalize(_as_batch(a), torch.zeros(1)))
    assert np.array_equal(ours, np.asarray(ImageOps.equalize(Image.fromarray(a))))


def test_autocontrast_posterize_and_solarize_match_pil():
    a = _uint8_image(low=30, high=200)
    v = _as_batch(a)
    pil = np.asarray(ImageOps.autocontrast(Image.fromarray(a))).astype(int)
    assert np.abs(_as_uint8(ops.autocontrast(v, torch.zeros(1))).astype(int) - pil).max() <= 1  # PIL truncates
    level = torch.tensor([5.5])  # posterize keeps 4 - int(2.2) = 2 bits; solarize threshold 256 - int(140.8) = 116
    assert np.array_equal(_as_uint8(ops.posterize(v, level)), np.asarray(ImageOps.posterize(Image.fromarray(a), 2)))
    assert np.array_equal(_as_uint8(ops.solarize(v, level)), np.asarray(ImageOps.solarize(Image.fromarray(a), 116)))


def test_translate_shifts_by_whole_pixels_with_black_fill_and_rotate_keeps_the_centre():
    v = _as_batch(_uint8_image(h=16, w=24))
    kind = torch.tensor([3])  # translate_x: int(level * (24 / 3) / 10) = 4 px at level 5
    theta = ops.affine_matrices(kind, torch.tensor([5.0]), torch.tensor([1.0]), 16, 24)
    grid = torch.nn.functional.affine_grid(theta, list(v.shape), align_corners=False)
    out = torch.nn.functional.grid_sample(v, grid, align_corners=False)
    torch.testing.assert_close(out[..., :-4], v[..., 4:], atol=1e-5, rtol=0)  # output(x) = input(x + 4)
    assert out[..., -4:].abs().max() < 1e-5  # black fill
    theta = ops.affine_matrices(torch.tensor([0]), torch.tensor([9.0]), torch.tensor([-1.0]), 16, 24)
    centre = torch.nn.functional.affine_grid(theta, [1, 3, 16, 24], align_corners=False)[0]
    torch.testing.assert_close(centre[7:9, 11:13].mean((0, 1)), torch.zeros(2), atol=1e-6, rtol=0)


def test_augmix_steps_dispatch_each_sample_to_its_own_operation():
    v = torch.rand(4, 3, 8, 8)
    am = AugMix(MEAN, STD, ops=("solarize", "equalize"))
    op = torch.tensor([0, 1, -1, 0])
    draws = Draws(v, gen(0))
    out = am._step(v, op, draws)
    level = Draws(v, gen(0)).uniform(4, 0.1, 3.0)  # the same first draw
    torch.testing.assert_close(out[0], ops.solarize(v[0:1], level[0:1])[0])
    torch.testing.assert_close(out[1], ops.equalize(v[1:2], level[1:2])[0])
    assert torch.equal(out[2], v[2])


def test_apply_groups_runs_each_function_once_on_its_group():
    x = torch.arange(5.0).view(5, 1, 1, 1)
    calls = []

    def plus(k):
        def fn(sub, idx):
            calls.append(idx.tolist())
            return sub + k
        return fn

    out = apply_groups(x, torch.tensor([1, 0, 1, -1, 0]), [plus(10), plus(100)])
    assert out.flatten().tolist() == [100.0, 11.0, 102.0, 3.0, 14.0]
    assert calls == [[1, 4], [0, 2]]


# -- texture corruption ----------------------------------------------------------------------------
def test_texture_without_strength_is_the_identity_and_blur_keeps_constants():
    x = images(n=3)
    out = TextureCorruption(MEAN, STD, kinds=("noise",), noise_std=0.0)(x, gen())
    torch.testing.assert_close(out, x, atol=1e-5, rtol=0)
    out = TextureCorruption(MEAN, STD, kinds=("texture",), texture_strength=0.0)(x, gen())
    torch.testing.assert_close(out, x, atol=1e-5, rtol=0)
    flat = torch.full((1, 3, 12, 12), 0.3)
    torch.testing.assert_close(gaussian_blur(flat, 2.0), flat)
    k = gaussian_blur(torch.zeros(1, 1, 15, 15).index_put_((torch.tensor([0]), torch.tensor([0]), torch.tensor([7]),
                                                            torch.tensor([7])), torch.tensor(1.0)), 1.0)
    assert k.sum().item() == pytest.approx(1.0, abs=1e-5)  # the kernel is normalised


# -- every registered augmentation -----------------------------------------------------------------
@pytest.mark.parametrize("name", BATCH_AUGMENTATIONS.names())
@pytest.mark.parametrize("shape", [(6, 32, 32), (3, 20, 28)])
def test_augmentations_are_seeded_and_keep_shape_dtype_and_range(name, shape):
    n, h, w = shape
    x = images(n, h, w).contiguous(memory_format=torch.channels_last)
    aug = build_augmentation(name, MEAN, STD)
    a, b, c = aug(x, gen(7)), aug(x, gen(7)), aug(x, gen(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.shape == x.shape and a.dtype == x.dtype and a.device == x.device
    lo, hi = bounds()
    assert (a >= lo - 1e-5).all() and (a <= hi + 1e-5).all()
    assert not torch.equal(a, x)
    torch.manual_seed(3)
    d = aug(x)
    torch.manual_seed(3)
    assert torch.equal(aug(x), d)  # generator=None: torch's seeded global generators


def test_complement_cycles_through_its_generators_view_by_view():
    x = images(n=4)
    complement = StyleComplement(MEAN, STD)
    views = complement.views(x, 4, gen(5))
    g = gen(5)
    expected = [RandConv(MEAN, STD)(x, g), AugMix(MEAN, STD)(x, g), TextureCorruption(MEAN, STD)(x, g),
                RandConv(MEAN, STD)(x, g)]
    for got, want in zip(views, expected):
        assert torch.equal(got, want)
    assert not torch.equal(views[0], views[3])  # a fresh filter per repetition


def test_options_are_parsed_and_bad_ones_are_one_line_errors():
    assert parse_options("randconv", "kernel_sizes=1/3, per_sample=true,mix_high=0.5") == {
        "kernel_sizes": (1, 3), "per_sample": True, "mix_high": 0.5}
    complement = build_augmentation("complement", MEAN, STD, "ops=randconv/texture,randconv.kernel_sizes=5,pick=sample")
    assert complement.members[0].kernel_sizes == (5,) and complement.pick == "sample" and len(complement.members) == 2
    bad = [("randconv", "nope=1", "no option 'nope'"), ("randconv", "per_sample=maybe", "not a valid bool"),
           ("randconv", "kernel_sizes=2", "odd"), ("augmix", "severity=20", "severity"),
           ("augmix", "ops=rotate/blur", "unknown 'blur'"), ("texture", "kinds=rain", "unknown 'rain'"),
           ("randconv", "randconv.mix=false", "dotted options"), ("complement", "augmix.mix=false", "no option 'mix'"),
           ("complement", "ops=randconv,augmix.width=2", "not among the complement ops"),
           ("randconv", "k", "NAME=VALUE")]
    for name, text, message in bad:
        with pytest.raises(ConfigError, match=message) as err:
            build_augmentation(name, MEAN, STD, text)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="choose one of"):
        build_augmentation("cutout", MEAN, STD)
    with pytest.raises(ConfigError, match="CPU torch.Generator"):
        Draws(torch.zeros(1), _NotCPU())


class _NotCPU:
    device = torch.device("cuda")


def test_sampling_grid_is_affine_grid():
    theta = torch.randn(5, 2, 3)
    torch.testing.assert_close(ops.sampling_grid(theta, 7, 9),
                               torch.nn.functional.affine_grid(theta, [5, 3, 7, 9], align_corners=False))
