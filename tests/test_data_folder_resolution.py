"""A folder of own images trains at the images' own size (capped at 224), not upsampled to 224 px; an explicit
resolution far above it warns in one line naming the better flag."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image

from fedstyle.data import load_dataset
from fedstyle.data.folder import MAX_DEFAULT_RESOLUTION


def make_folder(root, side: int, per_class: int = 2):
    for domain in ("a", "b"):
        for cls in ("x", "y"):
            folder = root / domain / cls
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(np.full((side, side, 3), 40 * i, np.uint8)).save(folder / f"{i}.png")
    return root


def test_the_default_resolution_is_the_images_size(tmp_path):
    root = make_folder(tmp_path / "small", 24)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = load_dataset("folder", data_root=str(root), progress=False)
    assert dataset.resolution == 24 and tuple(dataset.images["a"].shape[1:]) == (3, 24, 24)


def test_the_default_is_capped_at_224(tmp_path):
    root = make_folder(tmp_path / "big", 300, per_class=1)
    assert load_dataset("folder", data_root=str(root), progress=False).resolution == MAX_DEFAULT_RESOLUTION


def test_a_named_benchmark_keeps_its_resolution(tmp_path):
    from fedstyle.data.folder import BENCHMARKS, _folder_resolution, scan_domain

    root = make_folder(tmp_path / "small", 16)
    listings = {d: scan_domain(root / d) for d in ("a", "b")}
    assert _folder_resolution(BENCHMARKS.get("pacs"), None, listings) == 224  # the benchmark's, not the images'
    assert _folder_resolution(BENCHMARKS.get("digits_dg"), None, listings) == 32
    assert _folder_resolution(BENCHMARKS.get("folder"), None, listings) == 16


def test_an_upsampling_resolution_warns_with_the_flag_that_keeps_the_size(tmp_path):
    root = make_folder(tmp_path / "small", 16)
    with pytest.warns(UserWarning, match=r"--resolution 64 upsamples 16 px images 4x .*--resolution 16"):
        load_dataset("folder", data_root=str(root), progress=False, resolution=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset("folder", data_root=str(root), progress=False, resolution=24)  # under 2x: said nothing


def test_pretrained_on_small_images_picks_a_resnet_and_names_the_better_flags(tmp_path):
    from fedstyle.experiments.build import resolve_config
    from fedstyle.experiments.config import RunConfig

    dataset = load_dataset("folder", data_root=str(make_folder(tmp_path / "small", 24)), progress=False)
    scratch = RunConfig(dataset="folder", data_root=str(tmp_path / "small"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_config(scratch, dataset).backbone == "convnet"  # from scratch at 24 px: the small ConvNet
    with pytest.warns(UserWarning, match=r"--pretrained resnet18 at 24 px.*--resolution 224.*drop --pretrained"):
        assert resolve_config(scratch.updated(pretrained=True), dataset).backbone == "resnet18"  # the ConvNet has none
