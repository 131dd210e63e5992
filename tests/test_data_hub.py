"""Hugging Face datasets (``--dataset hf:OWNER/NAME``): a tiny parquet dataset with flwrlabs/pacs's schema,
loaded offline through ``datasets.load_dataset(NAME)`` from the caches an earlier download leaves."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("datasets")

from fedstyle.data import load_dataset  # noqa: E402
from fedstyle.errors import ConfigError, DataError  # noqa: E402
from fedstyle.partition import make_split  # noqa: E402
from hub_fixtures import (  # noqa: E402
    PACS_CLASSES, PACS_DOMAINS, cache_as_hub, offline_hf, snapshot_as_hub, tiny_pacs_rows, write_folder, write_parquet,
)


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "fedstyle-cache"))
    offline_hf(monkeypatch, tmp_path / "hf")
    return tmp_path / "hf"


def test_cached_hub_dataset_loads_offline_as_the_folder_benchmark(hf_home, tmp_path):
    rows = tiny_pacs_rows()
    cache_as_hub("flwrlabs/pacs", write_parquet(tmp_path / "repo", {"train": rows[::-1]}))  # row order must not matter
    import datasets

    assert len(datasets.load_dataset("flwrlabs/pacs")["train"].data.column("image").chunks) > 1
    dataset = load_dataset("hf:flwrlabs/pacs", resolution=8, progress=False)
    folder = load_dataset("pacs", data_root=str(write_folder(tmp_path / "folder", rows)), resolution=8, progress=False)
    assert dataset.domains == list(PACS_DOMAINS) and dataset.classes == list(PACS_CLASSES)
    assert (dataset.mean, dataset.std, dataset.augment) == (folder.mean, folder.std, folder.augment)
    for d in PACS_DOMAINS:  # the same decoder and order as the folder layout: identical pixels and labels
        assert dataset.labels[d].tolist() == [c for c in range(7) for _ in range(2)]
        assert np.array_equal(dataset.images[d].numpy(), folder.images[d].numpy())
    assert dataset.splits == {}  # one train split: no official splits
    recipe = dataset.info["recipe"]
    assert recipe["source"] == "flwrlabs/pacs" and recipe["fingerprints"]["train"]
    again = load_dataset("hf:flwrlabs/pacs", resolution=8, progress=False)
    assert again.info["cache_dir"] == dataset.info["cache_dir"]  # decoded once
    split = make_split(dataset, "ltdo", targets=["sketch"], val_domain="photo", seed=0)
    assert split.sources == ["art_painting", "cartoon"] and len(split.heldout["sketch"]) == 14


def test_hub_cache_snapshot_is_read_offline(hf_home, tmp_path):
    rows = tiny_pacs_rows(per_class=1)
    snapshot_as_hub("flwrlabs/pacs", write_parquet(tmp_path / "repo", {"train": rows}))
    dataset = load_dataset("hf:flwrlabs/pacs", resolution=8, progress=False)
    assert [dataset.size(d) for d in dataset.domains] == [7, 7, 7, 7]


def test_missing_dataset_offline_names_the_fix(hf_home):
    with pytest.raises(DataError) as err:
        load_dataset("hf:flwrlabs/pacs", progress=False)
    message = str(err.value)
    assert "\n" not in message and "offline mode is on" in message and "hf download flwrlabs/pacs" in message


def test_other_columns_string_labels_splits_and_local_folder(hf_home, tmp_path):
    rows = [{"picture": r["image"], "style": r["domain"].upper(), "category": PACS_CLASSES[r["label"]]}
            for r in tiny_pacs_rows(per_class=2)]
    from datasets import Features, Image as HFImage, Value

    features = Features({"picture": HFImage(), "style": Value("string"), "category": Value("string")})
    files = write_parquet(tmp_path / "repo", {"train": rows[0::2], "test": rows[1::2]}, features)
    cache_as_hub("someone/styles", files)
    with pytest.raises(DataError, match=r"no column 'domain' \(columns: picture, style, category\); pass --domain"):
        load_dataset("hf:someone/styles", image_column="picture", progress=False)
    options = dict(image_column="picture", domain_column="style", label_column="category", resolution=8, progress=False)
    dataset = load_dataset("hf:someone/styles", **options)
    assert dataset.domains == sorted(d.upper() for d in PACS_DOMAINS) and dataset.classes == sorted(PACS_CLASSES)
    assert dataset.resolution == 8 and dataset.name == "hf-someone--styles"
    # train / test splits are official splits: per domain, the rows of each split (decoded order: by class, name)
    assert dataset.splits["CARTOON"]["train"].tolist() == list(range(0, 14, 2))
    assert dataset.splits["CARTOON"]["test"].tolist() == list(range(1, 14, 2))
    split = make_split(dataset, "lodo", targets=["SKETCH"], val_fraction=0.3, seed=0)
    assert split.heldout["SKETCH"].tolist() == list(range(1, 14, 2))
    assert set(split.train["PHOTO"].tolist()) | set(split.val["PHOTO"].tolist()) == set(range(0, 14, 2))
    pooled = load_dataset("hf:someone/styles", official_splits=False, **options)
    assert pooled.splits == {} and pooled.info["cache_dir"] == dataset.info["cache_dir"]
    local = load_dataset(f"hf:{tmp_path / 'repo'}", **options)  # hf:DIR, a folder of data files
    assert all(np.array_equal(local.images[d].numpy(), dataset.images[d].numpy()) for d in dataset.domains)


def test_bad_input_gets_one_line_naming_the_fix(hf_home, tmp_path):
    rows = tiny_pacs_rows(per_class=1)
    cache_as_hub("flwrlabs/pacs", write_parquet(tmp_path / "a", {"train": rows[:-1]}))  # sketch lacks 'person'
    with pytest.raises(DataError, match="domain 'sketch' has no image of class\\(es\\) person .*every domain needs"):
        load_dataset("hf:flwrlabs/pacs", progress=False)
    odd = [dict(r, domain="watercolour") if r["domain"] == "photo" else r for r in rows]
    cache_as_hub("flwrlabs/office-home", write_parquet(tmp_path / "b", {"train": odd}))
    with pytest.raises(DataError, match="'art_painting', not a domain of officehome .*--domain-column"):
        load_dataset("hf:flwrlabs/office-home", progress=False)
    broken = [dict(r, image={"bytes": b"\x89PNG broken", "path": "x.png"}) if i == 3 else r for i, r in enumerate(rows)]
    cache_as_hub("someone/broken", write_parquet(tmp_path / "c", {"train": broken, "extra": rows}))
    with pytest.raises(DataError, match=r"cannot read image hf:someone/broken train row 3 \(x.png\).*--skip-bad"):
        load_dataset("hf:someone/broken", resolution=8, progress=False)
    with pytest.raises(DataError, match="split 'extra' .*--no-official-splits"):
        load_dataset("hf:someone/broken", resolution=8, skip_bad_images=True, progress=False)
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        kept = load_dataset("hf:someone/broken", resolution=8, skip_bad_images=True, official_splits=False,
                            progress=False)
    assert kept.size("art_painting") == 13 and kept.info["bad_images"][0][0].startswith("hf:someone/broken train row 3")
    with pytest.raises(ConfigError, match="not --data-root"):
        load_dataset("hf:flwrlabs/pacs", data_root=str(tmp_path))
    with pytest.raises(ConfigError, match="--domain-column names a column of a Hugging Face dataset"):
        load_dataset("digits4", domain_column="style")
    with pytest.raises(ConfigError, match="give hf:OWNER/NAME"):
        load_dataset("hf:not a/valid/name")


def test_unlabelled_rows_are_refused_before_anything_is_decoded(hf_home, tmp_path):
    rows = tiny_pacs_rows(per_class=1)
    unlabelled = [dict(r, label=-1) for r in rows[:3]]  # ClassLabel's missing value, as Hub test splits hold it
    cache_as_hub("someone/half", write_parquet(tmp_path / "repo", {"train": rows, "test": unlabelled}))
    cache = hf_home.parent / "fedstyle-cache"
    with pytest.raises(DataError, match=r"split 'test' has 3 row\(s\) without a class .*--label-column NAME"):
        load_dataset("hf:someone/half", resolution=8, progress=False)
    assert not cache.exists() or not any(cache.iterdir())  # refused before decoding: no cache entry written


def test_without_the_library_the_extra_is_named(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ConfigError, match=r"pip install -c constraints.txt 'fedstyle\[hf\]'"):
        load_dataset("hf:flwrlabs/pacs")


def test_fedstyle_run_on_a_hub_dataset_offline(hf_home, tmp_path, capsys, monkeypatch):
    from fedstyle.cli.main import main

    cache_as_hub("flwrlabs/pacs", write_parquet(tmp_path / "repo", {"train": tiny_pacs_rows(per_class=3)}))
    out = tmp_path / "run"
    code = main(["run", "--dataset", "hf:flwrlabs/pacs", "--protocol", "ltdo", "--target", "sketch", "--val-domain",
                 "photo", "--partition", "dirichlet", "--clients", "2", "--min-client-size", "2", "--resolution", "16",
                 "--rounds", "1", "--local-steps", "1", "--batch-size", "4", "--device", "cpu", "--quiet",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "hf:flwrlabs/pacs" and set(summary["targets"]) == {"sketch"}
    config = json.loads((out / "config.json").read_text())
    assert config["official_splits"] is True and config["domain_column"] is None
    monkeypatch.chdir(tmp_path)
    assert main(["data", "show", "hf:flwrlabs/pacs", "--resolution", "8", "--quiet"]) == 0
    assert (tmp_path / "hf-flwrlabs--pacs.png").is_file()  # one file, not a folder named hf:flwrlabs
    assert main(["data", "list"]) == 0 and "hf:OWNER/NAME" in capsys.readouterr().out
    code = main(["run", "--dataset", "digits4", "--label-column", "y", "--target", "mnist", "--out",
                 str(tmp_path / "x")])
    assert code == 2 and "--label-column names a column" in capsys.readouterr().err



OFFICE_HOME_AS_FLOWER = ("Art", "Clipart", "Product", "Real World")  # flwrlabs/office-home's domain values


def office_home_rows(classes: int = 65, size: int = 8) -> list[dict]:
    """One image per domain and class, with flwrlabs/office-home's columns and domain values."""
    from hub_fixtures import encode

    rng = np.random.default_rng(1)
    return [{"image": {"bytes": encode(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)), "path": f"{d}_{c}.png"},
             "domain": domain, "label": c}
            for d, domain in enumerate(OFFICE_HOME_AS_FLOWER) for c in range(classes)]


def test_a_local_copy_of_flowers_office_home_is_officehome_and_takes_real_world_as_target(hf_home, tmp_path, capsys):
    """hf:DIR holding flwrlabs/office-home's files: recognised by its schema (columns, the four domains, 65
    classes), so its domains are fedstyle's names and `--target Real_World` is accepted."""
    from hub_fixtures import pacs_features

    from fedstyle.cli.main import main

    names = [f"Object_{c:02d}" for c in range(65)]
    copy = tmp_path / "office-home"  # a folder of data files, as `hf download flwrlabs/office-home` leaves
    write_parquet(copy, {"train": office_home_rows()}, pacs_features(classes=names))
    dataset = load_dataset(f"hf:{copy}", resolution=8, progress=False)
    assert dataset.domains == ["Art", "Clipart", "Product", "Real_World"] and dataset.classes == names
    out = tmp_path / "run"
    code = main(["run", "--dataset", f"hf:{copy}", "--target", "Real_World", "--resolution", "16", "--rounds", "1",
                 "--local-steps", "1", "--batch-size", "4", "--selection", "last", "--device", "cpu", "--quiet",
                 "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert set(json.loads((out / "summary.json").read_text())["targets"]) == {"Real_World"}
    fewer = tmp_path / "not-office-home"  # 64 classes: not Office-Home, so its values stay as they are
    write_parquet(fewer, {"train": office_home_rows(classes=64)}, pacs_features(classes=names[:64]))
    assert load_dataset(f"hf:{fewer}", resolution=8, progress=False).domains == list(OFFICE_HOME_AS_FLOWER)


def test_a_saved_copy_of_flowers_pacs_is_pacs(hf_home, tmp_path):
    """A save_to_disk copy of flwrlabs/pacs (domain values in other letter cases) reads as the pacs benchmark:
    its domains in PACS's order with PACS's names, as hf:flwrlabs/pacs does."""
    import datasets

    from hub_fixtures import pacs_features

    rows = [dict(r, domain=r["domain"].replace("_", " ").title()) for r in tiny_pacs_rows(per_class=1)]
    columns = {name: [row[name] for row in rows] for name in ("image", "domain", "label")}
    saved = tmp_path / "my-copy"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns, features=pacs_features())}).save_to_disk(saved)
    dataset = load_dataset(f"hf:{saved}", resolution=8, progress=False)
    assert dataset.domains == list(PACS_DOMAINS) and dataset.classes == list(PACS_CLASSES)
    split = make_split(dataset, "lodo", targets=["art_painting"], seed=0)
    assert split.targets == ["art_painting"]
    named = load_dataset(f"hf:{saved}", resolution=8, progress=False, label_column="label", domain_column="domain")
    assert named.domains == list(PACS_DOMAINS)  # the default columns named outright: still recognised


def test_a_local_dataset_with_no_rows_is_one_line(hf_home, tmp_path, capsys):
    """`data show hf:DIR` on data files with no rows gave datasets' ValueError traceback ("Instruction 'train'
    corresponds to no data!"); an empty save_to_disk folder an IndexError."""
    import datasets

    from fedstyle.cli.main import main
    from hub_fixtures import pacs_features

    write_parquet(tmp_path / "files", {"train": []})
    datasets.Dataset.from_dict({"image": [], "domain": [], "label": []}, features=pacs_features()).save_to_disk(
        str(tmp_path / "saved"))
    capsys.readouterr()  # the fixtures' progress bars
    for folder in ("files", "saved"):
        code = main(["data", "show", f"hf:{tmp_path / folder}", "--out", str(tmp_path / "grid.png"), "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and err == [f"fedstyle: error: hf:{tmp_path / folder} has no rows (its data files are empty); "
                                     "give a folder whose data files hold images"]
    assert not (tmp_path / "grid.png").exists()


def test_data_show_draws_any_splits_and_names_a_corrupt_row_by_where_it_is(hf_home, tmp_path, capsys):
    """`data show` draws from every image, so a split outside train/val/test needs no flag: the message suggested
    --no-official-splits, which `data show` has not. A corrupt image without a path was named by its object's repr
    (`<fedstyle.data.hub._RowBytes object at 0x...>`) inside PIL's reason."""
    from fedstyle.cli.main import main

    rows = tiny_pacs_rows(per_class=1)
    write_parquet(tmp_path / "extra", {"train": rows, "extra": rows})
    grid = tmp_path / "grid.png"
    assert main(["data", "show", f"hf:{tmp_path / 'extra'}", "--resolution", "8", "--out", str(grid), "--quiet"]) == 0
    assert grid.is_file()
    broken = [dict(r, image={"bytes": b"\x89PNG broken", "path": None}) if i == 3 else r for i, r in enumerate(rows)]
    write_parquet(tmp_path / "broken", {"train": broken})
    capsys.readouterr()
    code = main(["data", "show", f"hf:{tmp_path / 'broken'}", "--resolution", "8", "--out", str(grid), "--quiet"])
    err = capsys.readouterr().err.strip()
    where = f"hf:{tmp_path / 'broken'} train row 3"
    assert code == 2 and len(err.splitlines()) == 1 and "object at 0x" not in err
    assert err.startswith(f"fedstyle: error: cannot read image {where} (UnidentifiedImageError: cannot identify "
                          f"image file {where})")


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:  # bound then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def hub_unreachable_online(hf_home, monkeypatch):
    """Offline mode off, no proxy, and the Hub's endpoint a local port that refuses connections."""
    import datasets
    import huggingface_hub.constants as hub_constants

    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    return hf_home


def test_an_unreachable_hub_reads_the_cache_offline_at_once(hub_unreachable_online, tmp_path, monkeypatch):
    # Online, the library retries each request with back-off (about 26 s) before it reads its cache; the
    # probe sees the refused connection and the load runs in offline mode from the start.
    import datasets
    import huggingface_hub.constants as hub_constants

    cache_as_hub("flwrlabs/pacs", write_parquet(tmp_path / "repo", {"train": tiny_pacs_rows(per_class=1)}))
    modes, real_load = [], datasets.load_dataset

    def spy(*args, **kwargs):
        modes.append((datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    dataset = load_dataset("hf:flwrlabs/pacs", resolution=8, progress=False)
    assert [dataset.size(d) for d in dataset.domains] == [7, 7, 7, 7]
    assert modes == [(True, True)]
    assert (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE) == (False, False)  # restored


def test_an_unreachable_hub_without_the_dataset_names_the_host_and_the_fix(hub_unreachable_online):
    import huggingface_hub.constants as hub_constants

    with pytest.raises(DataError) as err:
        load_dataset("hf:flwrlabs/pacs", progress=False)
    message = str(err.value)
    port = hub_constants.ENDPOINT.rsplit(":", 1)[1]
    assert "\n" not in message and f"cannot reach the Hugging Face Hub for hf:flwrlabs/pacs (127.0.0.1:{port}" in message
    assert "HF_HOME" in message


def test_the_probe_opens_one_connection_and_stands_aside_behind_a_proxy(monkeypatch):
    import socket

    from fedstyle.data.hub import hub_unreachable

    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert hub_unreachable(f"http://127.0.0.1:{server.getsockname()[1]}") is None
    closed = f"http://127.0.0.1:{_closed_port()}"
    assert hub_unreachable(closed).startswith("127.0.0.1:")
    assert hub_unreachable("https://no-such-host.invalid").startswith("no-such-host.invalid:443: ")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert hub_unreachable(closed) is None
