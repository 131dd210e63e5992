"""Official split lists of folder benchmarks (PACS's k-fold files, DomainNet's train/test lists): used when
present, ignored on request, refused when inconsistent; and how make_split uses official splits."""

from __future__ import annotations

import shutil

import pytest
import torch
from PIL import Image

from fedstyle.data import DomainDataset, load_dataset
from fedstyle.errors import DataError
from fedstyle.partition import make_split

pytestmark = pytest.mark.filterwarnings("ignore:.*classes but .* holds:UserWarning")  # 2 classes, not 7 / 345

PACS = ("art_painting", "cartoon", "photo", "sketch")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTYLE_CACHE", str(tmp_path / "cache"))


def tree(root, domains, classes=("dog", "horse"), per_class=3):
    """root/<domain>/<class>/pic_<k>.jpg; in each domain, decoded order is dog pic_0..2 then horse pic_0..2."""
    for domain in domains:
        for cls in classes:
            (root / domain / cls).mkdir(parents=True)
            for k in range(per_class):
                Image.new("RGB", (6, 6), (40 * k, 9, 9)).save(root / domain / cls / f"pic_{k}.jpg")
    return root


def write_list(path, entries, prefix=""):
    """Lines as the releases write them: '<prefix><domain>/<class>/<file> <label>' (PACS: 1-based labels)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{prefix}{e} {1 + ('horse' in e)}\n" for e in entries))


def pacs_release(base, crossval=("dog/pic_2.jpg", "horse/pic_0.jpg")):
    """base/pacs_data/<domains> and base/pacs_label/*_kfold.txt, as the PACS release ships them."""
    root = tree(base / "pacs_data", PACS)
    every = [f"{c}/pic_{k}.jpg" for c in ("dog", "horse") for k in range(3)]
    for d in PACS:
        write_list(base / "pacs_label" / f"{d}_train_kfold.txt", [f"{d}/{e}" for e in every if e not in crossval])
        write_list(base / "pacs_label" / f"{d}_crossval_kfold.txt", [f"{d}/{e}" for e in crossval])
        write_list(base / "pacs_label" / f"{d}_test_kfold.txt", [f"{d}/{e}" for e in every])
    return root


def test_pacs_kfold_lists_are_used_when_present(tmp_path):
    root = pacs_release(tmp_path)
    dataset = load_dataset("pacs", data_root=str(root), resolution=8, progress=False)
    # decoded order: dog pic_0, pic_1, pic_2, horse pic_0, pic_1, pic_2
    lists = {s: t.tolist() for s, t in dataset.splits["cartoon"].items()}
    assert lists == {"train": [0, 1, 4, 5], "val": [2, 3], "test": [0, 1, 2, 3, 4, 5]}
    assert dataset.info["official_splits"]["sketch"]["val"].endswith("pacs_label/sketch_crossval_kfold.txt")
    split = make_split(dataset, "lodo", targets=["sketch"], val_fraction=0.5, seed=3)  # val_fraction unused
    assert split.train["photo"].tolist() == [0, 1, 4, 5] and split.val["photo"].tolist() == [2, 3]
    assert split.heldout["sketch"].tolist() == list(range(6)) and split.official == list(PACS)
    assert make_split(dataset, "lodo", targets=["sketch"], seed=4).train["photo"].tolist() == [0, 1, 4, 5]  # any seed
    small = dataset.subset_per_class(2, seed=0)  # the lists follow the kept images, renumbered
    kept = {s: t.tolist() for s, t in small.splits["photo"].items()}
    assert len(kept["test"]) == 4 and sorted(kept["train"] + kept["val"]) == kept["test"]


def test_absent_or_ignored_lists_leave_the_seeded_split(tmp_path):
    root = tree(tmp_path / "plain", PACS)
    dataset = load_dataset("pacs", data_root=str(root), resolution=8, progress=False)
    assert dataset.splits == {}
    split = make_split(dataset, "lodo", targets=["sketch"], val_fraction=0.34, seed=0)
    assert len(split.val["photo"]) == 2 and split.official == []  # one per class, seeded
    released = pacs_release(tmp_path / "release")
    ignored = load_dataset("pacs", data_root=str(released), resolution=8, official_splits=False, progress=False)
    assert ignored.splits == {} and "official_splits" not in ignored.info


def test_a_copy_of_the_tree_with_a_skipped_image_keeps_the_same_splits(tmp_path):
    root = pacs_release(tmp_path / "a")
    (root / "cartoon" / "dog" / "pic_0.jpg").write_bytes(b"not a jpeg")
    options = dict(resolution=8, skip_bad_images=True, progress=False)
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        first = load_dataset("pacs", data_root=str(root), **options)
    assert {s: t.tolist() for s, t in first.splits["cartoon"].items()} == {
        "train": [0, 3, 4], "val": [1, 2], "test": [0, 1, 2, 3, 4]}  # dog pic_0 left out, the rest renumbered
    # a copy (same relative paths, sizes, times) shares the cache entry, whose skipped image is named under
    # tmp_path/a: the copy's lists must leave out the same image (they were refused as out of range)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    with pytest.warns(UserWarning, match="skipped 1 unreadable"):
        copy = load_dataset("pacs", data_root=str(tmp_path / "b" / "pacs_data"), **options)
    assert copy.info["cache_dir"] == first.info["cache_dir"]
    assert {d: {s: t.tolist() for s, t in lists.items()} for d, lists in copy.splits.items()} == {
        d: {s: t.tolist() for s, t in lists.items()} for d, lists in first.splits.items()}


def test_inconsistent_lists_get_one_line_naming_the_fix(tmp_path):
    root = pacs_release(tmp_path / "a")
    (tmp_path / "a" / "pacs_label" / "photo_crossval_kfold.txt").unlink()
    with pytest.raises(DataError, match="lack photo_crossval_kfold.txt; add the release's file\\(s\\) or pass "
                                        "--no-official-splits"):
        load_dataset("pacs", data_root=str(root), resolution=8, progress=False)
    root = pacs_release(tmp_path / "b", crossval=("dog/pic_2.jpg", "horse/pic_9.jpg"))
    with pytest.raises(DataError, match="1 image\\(s\\) of art_painting_crossval_kfold.txt are not in the "
                                        "art_painting folder \\(first: horse/pic_9.jpg\\).*--no-official-splits"):
        load_dataset("pacs", data_root=str(root), resolution=8, progress=False)
    root = pacs_release(tmp_path / "c")
    write_list(tmp_path / "c" / "pacs_label" / "cartoon_crossval_kfold.txt", ["cartoon/dog/pic_0.jpg"])
    with pytest.raises(DataError, match="cartoon: official train and val splits overlap"):
        load_dataset("pacs", data_root=str(root), resolution=8, progress=False)


def test_domainnet_train_test_lists_with_absolute_paths(tmp_path):
    domains = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
    root = tree(tmp_path / "domainnet", domains, per_class=4)
    for d in domains:  # lists in the data root, absolute paths (as some repositories rewrite them)
        write_list(root / f"{d}_train.txt", [f"{d}/{c}/pic_{k}.jpg" for c in ("dog", "horse") for k in (0, 1, 2)],
                   prefix="/data/DomainNet/")
        write_list(root / f"{d}_test.txt", [f"{d}/{c}/pic_3.jpg" for c in ("dog", "horse")], prefix="/data/DomainNet/")
    dataset = load_dataset("domainnet", data_root=str(root), resolution=8, progress=False)
    assert dataset.splits["real"]["train"].tolist() == [0, 1, 2, 4, 5, 6]
    assert dataset.splits["real"]["test"].tolist() == [3, 7]
    split = make_split(dataset, "lodo", targets=["real"], val_fraction=0.34, seed=0)
    # sources: validation is a stratified share of the train list; the test list is never trained on
    painting = split.train["painting"].tolist() + split.val["painting"].tolist()
    assert sorted(painting) == [0, 1, 2, 4, 5, 6] and len(split.val["painting"]) == 2
    assert split.heldout["real"].tolist() == [3, 7]


def toy(splits):
    labels = {"a": torch.tensor([0, 1, 0, 1, 0, 1]), "b": torch.tensor([0, 0, 1, 1])}
    images = {d: torch.zeros(len(y), 3, 8, 8, dtype=torch.uint8) for d, y in labels.items()}
    return DomainDataset("toy", ["a", "b"], ["x", "y"], images, labels, splits=splits)


def test_make_split_reads_official_splits_and_the_contract_checks_them():
    dataset = toy({"a": {"train": torch.tensor([0, 1, 2, 3]), "val": torch.tensor([5])},
                   "b": {"test": torch.tensor([1, 2])}})
    split = make_split(dataset, "lodo", targets=["b"])
    assert split.train["a"].tolist() == [0, 1, 2, 3] and split.val["a"].tolist() == [5]  # row 4 in neither
    assert split.heldout["b"].tolist() == [1, 2] and split.official == ["a", "b"]
    assert make_split(dataset, "lodo", targets=["a"]).heldout["a"].tolist() == list(range(6))  # no test list: all
    for bad, message in (({"c": {"train": torch.tensor([0])}}, "not a domain"),
                         ({"a": {"dev": torch.tensor([0])}}, "'dev' is not one of"),
                         ({"a": {"train": torch.tensor([3, 1])}}, "sorted unique indices in \\[0, 6\\)"),
                         ({"a": {"train": torch.tensor([6])}}, "sorted unique"),
                         ({"a": {"train": torch.tensor([0, 1]), "val": torch.tensor([1])}}, "overlap")):
        with pytest.raises(DataError, match=message):
            toy(bad)
    with pytest.raises(DataError, match="official train list has no samples"):
        make_split(toy({"a": {"train": torch.tensor([], dtype=torch.long)}}), "lodo", targets=["b"])


def test_the_cli_flag_and_runs_saved_before_official_splits(tmp_path):
    import json

    from fedstyle.cli.flags import config_from_args
    from fedstyle.cli.main import build_parser
    from fedstyle.experiments.config import RunConfig
    from fedstyle.experiments.rundir import read_run_config

    args = build_parser().parse_args(["run", "--dataset", "pacs", "--no-official-splits"])
    assert config_from_args(args).official_splits is False
    assert config_from_args(build_parser().parse_args(["run"])).official_splits is True
    old = RunConfig().to_dict()
    del old["official_splits"]  # a run directory from before: its domains were split by the seeded rule
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert read_run_config(tmp_path).official_splits is False


def test_pacs_lists_in_correct_txt_lists_are_used(tmp_path):
    """correct_txt_lists/ is where several FedDG repositories keep PACS's corrected lists."""
    root = pacs_release(tmp_path)
    (tmp_path / "pacs_label").rename(root / "correct_txt_lists")
    dataset = load_dataset("pacs", data_root=str(root), resolution=8, progress=False)
    assert dataset.splits["cartoon"]["val"].tolist() == [2, 3]
    assert dataset.info["official_splits"]["photo"]["train"].endswith("correct_txt_lists/photo_train_kfold.txt")


def test_the_split_source_is_said_without_decoding(tmp_path):
    from fedstyle.data.split_lists import describe_split_source

    plain = tree(tmp_path / "plain", PACS)
    said = describe_split_source("pacs", plain, PACS)
    assert said.startswith("seeded per-class split of each domain (--val-fraction): no official pacs lists found")
    assert (f"put <domain>_train_kfold.txt, <domain>_crossval_kfold.txt, <domain>_test_kfold.txt for each domain "
            f"in {plain / 'splits'} (or {plain} or {plain / 'correct_txt_lists'})") in said
    root = pacs_release(tmp_path / "release")
    assert describe_split_source("pacs", root, PACS) == f"official pacs lists from {tmp_path / 'release' / 'pacs_label'}"
    off = describe_split_source("pacs", root, PACS, official_splits=False)
    assert off.endswith("official lists off (--no-official-splits)")
    assert describe_split_source("officehome", plain, ["Art"]).endswith("officehome has no official split lists")
    (tmp_path / "release" / "pacs_label" / "photo_train_kfold.txt").unlink()  # incomplete: the loader's refusal
    with pytest.raises(DataError, match="lack photo_train_kfold.txt"):
        describe_split_source("pacs", root, PACS)


def test_domainnet_lines_naming_domainbeds_deleted_duplicates_are_skipped(tmp_path):
    """`data download domainnet` deletes DomainBed's duplicates, which the official lists still name; a line naming
    one of them, absent, is skipped. Any other absent image is still refused, and a duplicate kept is used."""
    domains = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
    duplicate = "clipart/animal_migration/clipart_006_000227.jpg"  # the first line of domain_net_duplicates.txt
    root = tree(tmp_path / "domainnet", domains, classes=("animal_migration", "zebra"), per_class=2)
    for d in domains:
        write_list(root / f"{d}_train.txt", [f"{d}/{c}/pic_0.jpg" for c in ("animal_migration", "zebra")])
        write_list(root / f"{d}_test.txt", [f"{d}/{c}/pic_1.jpg" for c in ("animal_migration", "zebra")])
    with open(root / "clipart_train.txt", "a") as handle:
        handle.write(f"{duplicate} 5\n")
    dataset = load_dataset("domainnet", data_root=str(root), resolution=8, progress=False)
    assert dataset.splits["clipart"]["train"].tolist() == [0, 2]
    Image.new("RGB", (6, 6), (1, 2, 3)).save(root / duplicate)  # a folder that kept it: the line is used
    kept = load_dataset("domainnet", data_root=str(root), resolution=8, progress=False)
    assert kept.splits["clipart"]["train"].tolist() == [0, 1, 3]  # animal_migration: clipart_006..., pic_0, pic_1
    (root / duplicate).unlink()
    with open(root / "real_train.txt", "a") as handle:
        handle.write("real/zebra/not_a_duplicate.jpg 1\n")
    with pytest.raises(DataError, match="1 image\\(s\\) of real_train.txt are not in the real folder"):
        load_dataset("domainnet", data_root=str(root), resolution=8, progress=False)
