"""Folder datasets: layout checks, decoding of awkward files, skipping, caching, benchmarks."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from fedstyle.data import DATASETS, load_dataset, save_grid
from fedstyle.data.folder import load_folder_benchmark
from fedstyle.errors import ConfigError, DataError, UnknownNameError

RED = (200, 30, 40)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))


def solid(colour, size=(12, 9), mode="RGB") -> Image.Image:
    return Image.new(mode, size, colour)


def make_tree(root, domains=("dom_a", "dom_b"), classes=("cat", "dog"), per_class=2):
    for domain in domains:
        for cls in classes:
            folder = root / domain / cls
            folder.mkdir(parents=True)
            for i in range(per_class):
                solid(RED).save(folder / f"img{i}.png")
    return root


def test_awkward_files_decode_to_rgb(tmp_path):
    root = make_tree(tmp_path / "data", per_class=1)
    cat = root / "dom_a" / "cat"
    solid(RED).save(cat / "b_upper.PNG")
    solid(RED).save(cat / "c_upper.JPG", format="JPEG", quality=95)
    solid(RED).save(cat / "d.jpeg", format="JPEG", quality=95)
    solid(128, mode="L").save(cat / "e_grey.png")
    rgba = solid((0, 0, 255, 0), mode="RGBA")  # fully transparent: composited on white
    rgba.putpixel((0, 0), (0, 0, 255, 255))
    rgba.save(cat / "f_rgba.png")
    solid(RED).convert("P").save(cat / "g_palette.png")
    (cat / "notes.txt").write_text("not an image")
    dataset = load_dataset("folder", data_root=str(root), resolution=8, progress=False)
    assert dataset.domains == ["dom_a", "dom_b"] and dataset.classes == ["cat", "dog"]
    assert dataset.size("dom_a") == 8 and dataset.size("dom_b") == 2
    assert dataset.labels["dom_a"].tolist() == [0] * 7 + [1]  # sorted by class, then file name
    assert dataset.info["ignored_files"] == 1
    x = dataset.images["dom_a"].numpy().astype(int)  # order: b, c, d, e, f, g, img0 (cat) ...
    names = sorted(p.name for p in cat.iterdir() if p.suffix.lower() != ".txt")
    pixel = {name: x[i, :, 4, 4] for i, name in enumerate(names)}
    assert pixel["img0.png"].tolist() == list(RED)
    assert pixel["b_upper.PNG"].tolist() == list(RED)
    assert np.abs(pixel["c_upper.JPG"] - RED).max() < 12
    assert pixel["e_grey.png"].tolist() == [128, 128, 128]
    assert pixel["f_rgba.png"].tolist() == [255, 255, 255]
    assert np.abs(pixel["g_palette.png"] - RED).max() < 40
    assert dataset.images["dom_a"].shape == (8, 3, 8, 8)


def test_corrupt_image_is_named_or_skipped(tmp_path):
    root = make_tree(tmp_path / "data")
    broken = root / "dom_b" / "dog" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    truncated = root / "dom_b" / "cat" / "cut.png"
    solid(RED, size=(64, 64)).save(truncated)
    truncated.write_bytes(truncated.read_bytes()[:60])
    with pytest.raises(DataError, match="broken.jpg|cut.png") as err:
        load_dataset("folder", data_root=str(root), resolution=8, progress=False)
    assert "skip_bad_images" in str(err.value)
    with pytest.warns(UserWarning, match=r"skipped 2 unreadable image\(s\): .*(broken.jpg|cut.png) \(.*`fedstyle data "
                                         r"check .*data` lists them all\)"):
        dataset = load_dataset("folder", data_root=str(root), resolution=8, skip_bad_images=True, progress=False)
    assert dataset.info["skipped_images"] == 2
    assert {os.path.basename(path) for path, _ in dataset.info["bad_images"]} == {"broken.jpg", "cut.png"}
    assert dataset.size("dom_b") == 4 and dataset.class_counts("dom_b").tolist() == [2, 2]
    assert (dataset.images["dom_b"].numpy() == np.array(RED, dtype=np.uint8)[:, None, None]).all()
    # the cache now holds the skipped version; a strict load must still refuse it
    with pytest.raises(DataError, match="cannot read image"):
        load_dataset("folder", data_root=str(root), resolution=8, progress=False)


def test_skipping_every_image_of_a_class_in_one_domain_is_refused(tmp_path):
    """--skip-bad-images must not make the class sets differ across domains (the run went on, one warning)."""
    root = make_tree(tmp_path / "data")
    for image in (root / "dom_b" / "dog").iterdir():
        image.write_bytes(b"not an image at all")
    with pytest.raises(DataError, match=r"every image of class 'dog' in domain 'dom_b' is unreadable .*dom_b.*; "
                                        r"replace them, or remove that class from every domain"):
        load_dataset("folder", data_root=str(root), resolution=8, skip_bad_images=True, progress=False)


def test_missing_root_explains_layout(tmp_path):
    with pytest.raises(DataError, match="does not exist") as err:
        load_dataset("folder", data_root=str(tmp_path / "nowhere"), progress=False)
    assert str(tmp_path / "nowhere") in str(err.value) and "<domain>/<class>/<image>" in str(err.value)


def test_differing_class_sets_are_named(tmp_path):
    root = make_tree(tmp_path / "data")
    (root / "dom_b" / "dog").rename(root / "dom_b" / "bird")
    with pytest.raises(DataError, match="'dom_b'") as err:
        load_dataset("folder", data_root=str(root), progress=False)
    assert "missing ['dog']" in str(err.value) and "extra ['bird']" in str(err.value)


def test_empty_class_folder_is_named(tmp_path):
    root = make_tree(tmp_path / "data")
    (root / "dom_a" / "fish").mkdir()
    (root / "dom_b" / "fish").mkdir()
    solid(RED).save(root / "dom_b" / "fish" / "x.png")
    with pytest.raises(DataError, match="fish has no .jpg/.jpeg/.png images"):
        load_dataset("folder", data_root=str(root), progress=False)


def test_images_outside_class_folders_are_rejected(tmp_path):
    root = make_tree(tmp_path / "data")
    solid(RED).save(root / "dom_a" / "loose.png")
    with pytest.raises(DataError, match="one folder per class"):
        load_dataset("folder", data_root=str(root), progress=False)


def test_second_load_reads_the_cache_and_changes_invalidate_it(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "data")
    from fedstyle.data import folder

    calls = []
    real = folder.decode_image
    monkeypatch.setattr(folder, "decode_image", lambda *a: calls.append(a[0]) or real(*a))
    load_dataset("folder", data_root=str(root), resolution=8, progress=False)
    assert len(calls) == 8
    load_dataset("folder", data_root=str(root), resolution=8, progress=False)
    assert len(calls) == 8
    solid((0, 0, 0)).save(root / "dom_a" / "cat" / "zzz.png")
    dataset = load_dataset("folder", data_root=str(root), resolution=8, progress=False)
    assert len(calls) == 17 and dataset.size("dom_a") == 5
    assert dataset.images["dom_a"][2].max() == 0  # cat/zzz.png sorts after cat/img1.png
    load_dataset("folder", data_root=str(root), resolution=10, progress=False)
    assert len(calls) == 26


def test_named_benchmark_requires_root_and_its_domains(tmp_path):
    with pytest.raises(ConfigError, match="--data-root DIR pointing at the PACS folder with art_painting/"):
        load_dataset("pacs", progress=False)
    root = make_tree(tmp_path / "pacs", domains=("art_painting", "cartoon", "photo"))
    with pytest.raises(DataError, match="sketch missing"):
        load_dataset("pacs", data_root=str(root), progress=False)
    make_tree(tmp_path / "pacs_extra", domains=("sketch",))
    (tmp_path / "pacs_extra" / "sketch").rename(root / "sketch")
    with pytest.warns(UserWarning, match="7 classes"):
        dataset = load_dataset("pacs", data_root=str(root), resolution=16, progress=False)
    assert dataset.domains == ["art_painting", "cartoon", "photo", "sketch"]
    assert dataset.resolution == 16 and dataset.augment == "crop_flip"
    assert dataset.mean == pytest.approx((0.485, 0.456, 0.406))


def test_officehome_accepts_real_world_with_space(tmp_path):
    root = make_tree(tmp_path / "oh", domains=("Art", "Clipart", "Product", "Real World"), per_class=1)
    with pytest.warns(UserWarning, match="65 classes"):
        dataset = load_folder_benchmark("officehome", str(root), resolution=8, progress=False)
    assert dataset.domains == ["Art", "Clipart", "Product", "Real_World"]
    assert dataset.info["domain_folders"]["Real_World"].endswith("Real World")


def test_digits_dg_merges_train_val_splits(tmp_path):
    root = tmp_path / "digits_dg"
    for domain in ("mnist", "mnist_m", "svhn", "syn"):
        for split in ("train", "val"):
            for digit in range(10):
                folder = root / domain / split / str(digit)
                folder.mkdir(parents=True)
                solid(RED, size=(32, 32)).save(folder / f"{split}.jpg", format="JPEG")
    dataset = load_dataset("digits_dg", data_root=str(root), progress=False)
    assert dataset.resolution == 32 and dataset.augment == "crop" and dataset.mean == (0.5, 0.5, 0.5)
    assert dataset.class_counts("svhn").tolist() == [2] * 10


def test_registry_lists_everything():
    assert set(DATASETS.names()) == {
        "digits4", "fashion4", "pacs", "officehome", "vlcs", "domainnet", "digits_dg", "folder", "camelyon17"
    }
    for name, entry in DATASETS.items():
        assert entry.name == name and entry.description
    with pytest.raises(UnknownNameError, match="choose one of: camelyon17, digits4, .*; or hf:OWNER/NAME"):
        load_dataset("mnist")


def test_save_grid_writes_a_png_atomically(tmp_path):
    root = make_tree(tmp_path / "data", classes=("cat", "dog", "emu"))
    dataset = load_dataset("folder", data_root=str(root), resolution=8, progress=False)
    out = save_grid(dataset, tmp_path / "grids" / "grid.png", per_cell=2)
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > image.size[1] > 50
    assert sorted(p.name for p in (tmp_path / "grids").iterdir()) == ["grid.pdf", "grid.png"]  # no temps


def test_data_show_into_a_folder_writes_the_default_name_there(tmp_path, capsys):
    """`data show --out DIR` failed on an atomic temp file ("Is a directory: /.tmp...")."""
    from fedstyle.cli.main import main

    root = make_tree(tmp_path / "data")
    grids = tmp_path / "grids"
    grids.mkdir()
    assert main(["data", "show", "folder", "--data-root", str(root), "--resolution", "8", "--out", str(grids),
                 "--quiet"]) == 0
    assert (grids / "folder.png").is_file() and f"wrote {grids / 'folder.png'}" in capsys.readouterr().out


def test_an_image_above_pils_pixel_limit_is_one_line_naming_it(tmp_path, monkeypatch, capsys, recwarn):
    """PIL's DecompressionBombWarning (its raw text, with no file name) was printed for a 144-Mpixel PNG. Now: one
    line naming the file and how to allow such images; above twice the limit PIL refuses and the error says how.
    The limit is lowered here (a 12 x 12 image against 100 pixels) rather than a 144-Mpixel file written."""
    from fedstyle.data.folder import MAX_PIXELS_ENV

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    root = tmp_path / "data"
    for domain in ("dom_a", "dom_b"):
        (root / domain / "cat").mkdir(parents=True)
        solid(RED, (8, 8)).save(root / domain / "cat" / "small.png")
    solid(RED, (12, 12)).save(root / "dom_a" / "cat" / "large.png")  # 144 > 100 pixels: PIL warns
    dataset = load_dataset("folder", data_root=str(root), resolution=8, progress=False)
    assert dataset.size("dom_a") == 2
    err = capsys.readouterr().err.strip().splitlines()
    large = root / "dom_a" / "cat" / "large.png"
    assert [line for line in err if "decompression-bomb" in line] == [
        f"fedstyle: image {large} is 12x12 = 144 pixels, above PIL's decompression-bomb limit of 100 pixels; decoded "
        f"(if images that large are intended, set {MAX_PIXELS_ENV}=N above it to silence this)"]
    assert not [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)]
    solid(RED, (15, 15)).save(root / "dom_b" / "cat" / "huge.png")  # 225 > 2 x 100: PIL refuses
    with pytest.raises(DataError, match=rf"cannot read image {root / 'dom_b' / 'cat' / 'huge.png'} "
                                        rf"\(DecompressionBombError: .*set {MAX_PIXELS_ENV}=N\)"):
        load_dataset("folder", data_root=str(root), resolution=8, progress=False)
    capsys.readouterr()
    monkeypatch.setenv(MAX_PIXELS_ENV, "1000")  # the way to allow them
    assert load_dataset("folder", data_root=str(root), resolution=8, progress=False).size("dom_b") == 2
    assert "decompression-bomb" not in capsys.readouterr().err
    monkeypatch.setenv(MAX_PIXELS_ENV, "lots")
    solid(RED, (8, 8)).save(root / "dom_b" / "cat" / "another.png")
    with pytest.raises(ConfigError, match=f"{MAX_PIXELS_ENV}='lots' is not a pixel count"):
        load_dataset("folder", data_root=str(root), resolution=8, progress=False)
