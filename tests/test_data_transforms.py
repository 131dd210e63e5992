"""Batched augmentation and normalisation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedstyle.data.transforms import (
    AUGMENTATIONS,
    BatchTransform,
    crop_padding,
    gather_pixels,
    random_crop,
    random_crop_flip,
    reflect_indices,
)
from fedstyle.errors import ConfigError

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def batch(size: int = 8, res: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (size, 3, res, res), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def all_crops(image: torch.Tensor) -> list[torch.Tensor]:
    """Every crop of the reflection-padded image, computed the slow, obvious way."""
    res = image.shape[-1]
    pad = crop_padding(res)
    padded = F.pad(image[None].float(), (pad, pad, pad, pad), mode="reflect")[0].to(torch.uint8)
    return [padded[:, dy : dy + res, dx : dx + res] for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)]


def test_padding_rule():
    assert crop_padding(32) == 4 and crop_padding(224) == 28 and crop_padding(8) == 2


@pytest.mark.parametrize("res", [8, 13, 32])
def test_gather_with_known_offsets_equals_pad_then_crop(res):
    x = batch(size=3, res=res)
    pad = crop_padding(res)
    padded = F.pad(x.float(), (pad, pad, pad, pad), mode="reflect").to(torch.uint8)
    for dy, dx in [(0, 0), (pad, pad), (2 * pad, 2 * pad), (0, 2 * pad), (1, pad + 1)]:
        offsets_y = torch.full((3,), dy)
        offsets_x = torch.full((3,), dx)
        out = gather_pixels(x, reflect_indices(res, offsets_y, pad), reflect_indices(res, offsets_x, pad))
        assert torch.equal(out, padded[:, :, dy : dy + res, dx : dx + res])
    centre = torch.full((3,), pad)
    assert torch.equal(gather_pixels(x, reflect_indices(res, centre, pad), reflect_indices(res, centre, pad)), x)


def test_reflect_indices_by_hand():
    # size 5, padding 2, offset 0: positions -2..2 -> 2 1 0 1 2; offset 4: 2..6 -> 2 3 4 3 2
    assert reflect_indices(5, torch.tensor([0, 4]), 2).tolist() == [[2, 1, 0, 1, 2], [2, 3, 4, 3, 2]]
    with pytest.raises(ConfigError):
        reflect_indices(2, torch.tensor([0]), 2)


def test_random_crop_outputs_are_crops_with_per_sample_offsets():
    x = batch(size=1, res=16).repeat(32, 1, 1, 1)
    out = random_crop(x, torch.Generator().manual_seed(1))
    candidates = all_crops(x[0])
    for sample in out:
        assert any(torch.equal(sample, c) for c in candidates)
    assert len({bytes(sample.numpy()) for sample in out}) > 8  # offsets differ per sample


def test_crop_flip_outputs_are_crops_or_mirrored_crops():
    x = batch(size=1, res=16).repeat(40, 1, 1, 1)
    out = random_crop_flip(x, torch.Generator().manual_seed(2))
    candidates = all_crops(x[0])
    flipped_seen = plain_seen = False
    for sample in out:
        plain = any(torch.equal(sample, c) for c in candidates)
        mirrored = any(torch.equal(sample.flip(-1), c) for c in candidates)
        assert plain or mirrored
        plain_seen |= plain
        flipped_seen |= mirrored and not plain
    assert plain_seen and flipped_seen


@pytest.mark.parametrize("augment", AUGMENTATIONS.names())
def test_same_generator_same_batch(augment):
    transform = BatchTransform((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), augment)
    x = batch()
    a = transform(x, train=True, generator=torch.Generator().manual_seed(3))
    b = transform(x, train=True, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    if augment != "none":
        c = transform(x, train=True, generator=torch.Generator().manual_seed(4))
        assert not torch.equal(a, c)


def test_default_generator_follows_torch_manual_seed():
    transform = BatchTransform((0.5,) * 3, (0.5,) * 3, "crop_flip")
    x = batch()
    torch.manual_seed(5)
    a = transform(x, train=True)
    torch.manual_seed(5)
    assert torch.equal(a, transform(x, train=True))


@pytest.mark.parametrize("device", DEVICES)
def test_eval_only_normalises(device):
    x = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 3, 1, 1).expand(2, 3, 2, 2).contiguous().to(device)
    transform = BatchTransform((0.0, 0.2, 0.5), (1.0, 0.5, 0.25), "crop_flip")
    out = transform(x, train=False)
    assert out.dtype == torch.float32 and out.device == x.device and out.shape == x.shape
    # channel 0: 0/255 - 0 = 0; channel 1: (0.2 - 0.2) / 0.5 = 0; channel 2: (1 - 0.5) / 0.25 = 2
    expected = torch.tensor([0.0, 0.0, 2.0]).view(1, 3, 1, 1).expand(2, 3, 2, 2)
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_train_output_is_normalised_crop(device):
    x = batch(size=4, res=8).to(device)
    transform = BatchTransform((0.5,) * 3, (0.25,) * 3, "crop")
    out = transform(x, train=True, generator=torch.Generator().manual_seed(0))
    assert out.dtype == torch.float32 and out.device == x.device and out.shape == x.shape
    pixels = (out * 0.25 + 0.5) * 255
    torch.testing.assert_close(pixels, pixels.round(), atol=1e-3, rtol=0)
    assert pixels.min() >= -1e-3 and pixels.max() <= 255 + 1e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_and_gpu_batches_match():
    x = batch(size=16, res=32)
    transform = BatchTransform((0.4, 0.5, 0.6), (0.2, 0.25, 0.3), "crop_flip")
    cpu = transform(x, train=True, generator=torch.Generator().manual_seed(9))
    gpu = transform(x.cuda(), train=True, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-6, rtol=0)


def test_bad_inputs():
    with pytest.raises(ConfigError):
        BatchTransform((0.5,) * 3, (0.5,) * 3, "rotate")
    with pytest.raises(ConfigError):
        BatchTransform((0.5, 0.5), (0.5,) * 3)
    with pytest.raises(ConfigError):
        BatchTransform((0.5,) * 3, (0.5, 0.0, 0.5))
    with pytest.raises(ConfigError, match="uint8"):
        BatchTransform((0.5,) * 3, (0.5,) * 3)(torch.zeros(1, 3, 4, 4), train=False)


def test_output_size_resizes_after_the_crop_so_a_small_cache_feeds_a_large_model():
    """--input-resolution (issue 54): images stored at 8 px reach the model at 16 px; a constant image stays
    constant (bilinear weights sum to one) and a flip of the stored batch is a flip of the output."""
    from fedstyle.data.transforms import BatchTransform

    flat = torch.full((2, 3, 8, 8), 51, dtype=torch.uint8)
    out = BatchTransform((0.5, 0.5, 0.5), (0.25, 0.25, 0.25), "crop_flip", output_size=16)(
        flat, train=True, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 3, 16, 16) and out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, torch.full_like(out, (51 / 255 - 0.5) / 0.25))
    ramp = torch.arange(8, dtype=torch.uint8).mul(30).expand(1, 3, 8, 8).contiguous()
    plain = BatchTransform((0, 0, 0), (1, 1, 1), "none", output_size=16)
    torch.testing.assert_close(plain(ramp.flip(-1), train=False), plain(ramp, train=False).flip(-1))
    assert plain(ramp, train=False)[0, 0, 0, 0] == 0 and plain(ramp, train=False)[0, 0, 0, -1] == 210 / 255
    assert BatchTransform((0, 0, 0), (1, 1, 1), output_size=8)(ramp, train=False).shape == ramp.shape
