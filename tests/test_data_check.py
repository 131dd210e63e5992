"""``fedstyle data check DIR``: counts per domain and class, image sizes and unreadable files, before training."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fedstyle.cli.main import main
from fedstyle.data.check import check_folder, report_lines


def image(path, width: int, height: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((height, width, 3), 90, np.uint8)).save(path)


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "own"
    for i in range(3):
        image(root / "photo" / "cat" / f"{i}.png", 32, 32)
    for i in range(2):
        image(root / "photo" / "dog" / f"{i}.png", 32, 32)
        image(root / "sketch" / "cat" / f"{i}.jpg", 48, 40)
    image(root / "sketch" / "dog" / "0.png", 32, 32)
    (root / "sketch" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    (root / "sketch" / "dog" / "readme.txt").write_text("not an image")
    return root


def test_counts_sizes_and_unreadable_files(folder):
    check = check_folder(folder)
    assert check.counts == {"photo": {"cat": 3, "dog": 2}, "sketch": {"cat": 2, "dog": 2}}  # broken.jpg counted
    assert check.sizes == {(32, 32): 6, (48, 40): 2} and check.ignored == 1
    assert [name for name, _ in check.unreadable] == ["sketch/dog/broken.jpg"] and not check.ok
    assert check.resolution() == 32  # median longer side of 32, 32, 32, 32, 32, 32, 48, 48


def test_report_lines_and_exit_status(folder, capsys):
    lines = report_lines(check_folder(folder))
    assert lines[0] == f"{folder}: 2 domains, 2 classes, 9 images; 1 other files ignored"
    assert lines[1:5] == ["  class  photo  sketch", "  cat        3       2", "  dog        2       2",
                          "  total      5       4"]
    assert lines[5] == "image sizes: 32x32 (6), 48x40 (2)"
    assert lines[6].startswith("unreadable: 1 file(s)") and lines[7].startswith("  sketch/dog/broken.jpg: ")
    assert "trains at 32 px" in lines[-1]
    assert main(["data", "check", str(folder), "--quiet"]) == 1  # a run would stop on broken.jpg
    assert capsys.readouterr().out.splitlines() == lines
    (folder / "sketch" / "dog" / "broken.jpg").unlink()
    assert main(["data", "check", str(folder), "--quiet"]) == 0
    assert "unreadable: none" in capsys.readouterr().out


def test_a_class_missing_from_a_domain_is_named(tmp_path):
    image(tmp_path / "a" / "cat" / "0.png", 16, 16)
    image(tmp_path / "a" / "dog" / "0.png", 16, 16)
    image(tmp_path / "b" / "cat" / "0.png", 16, 16)
    check = check_folder(tmp_path)
    assert check.missing_classes() == {"b": ["dog"]} and not check.ok
    assert "missing: domain b has no folder for class(es) dog; every domain needs the same class folders" \
        in report_lines(check)


def test_one_domain_or_one_class_is_not_fine(tmp_path, capsys):
    """`data check` said fine (exit 0) for folders every run refuses."""
    image(tmp_path / "one" / "only" / "cat" / "0.png", 16, 16)
    image(tmp_path / "one" / "only" / "dog" / "0.png", 16, 16)
    assert main(["data", "check", str(tmp_path / "one"), "--quiet"]) == 1
    assert "too few: 1 domain: a run needs at least 2" in capsys.readouterr().out
    for domain in ("a", "b"):
        image(tmp_path / "mono" / domain / "cat" / "0.png", 16, 16)
    assert main(["data", "check", str(tmp_path / "mono"), "--quiet"]) == 1
    assert "too few: 1 class: a classifier needs at least 2" in capsys.readouterr().out


def test_a_class_whose_every_image_is_unreadable_is_named(folder):
    (folder / "sketch" / "dog" / "0.png").write_bytes(b"not a png")  # with broken.jpg: no readable dog there
    lines = report_lines(check_folder(folder))
    assert "  every image of class dog in domain sketch is unreadable: --skip-bad-images would leave the class out " \
           "of that domain, which a run refuses" in lines


def test_a_class_whose_every_image_is_unreadable_is_named_in_a_split_layout(tmp_path):
    """DOMAIN/train/CLASS/IMAGE: the class is the file's parent folder, not the second part of its path."""
    for domain in ("a", "b"):
        for name in ("cat", "dog"):
            image(tmp_path / domain / "train" / name / "0.png", 16, 16)
    (tmp_path / "b" / "train" / "dog" / "0.png").write_bytes(b"not a png")
    check = check_folder(tmp_path)
    assert check.counts["b"] == {"cat": 1, "dog": 1} and check.all_unreadable() == [("b", "dog")]


def test_a_folder_that_is_not_a_dataset_gets_the_layout_error(tmp_path, capsys):
    image(tmp_path / "loose" / "0.png", 16, 16)  # images straight in a domain folder
    assert main(["data", "check", str(tmp_path), "--quiet"]) == 2
    assert "one folder per class" in capsys.readouterr().err
