"""The parity harness itself: every generator has its fixture, its test and its row in docs/parity.md; every
fixture names the repository and commit its generator pins; a generator refuses a bad checkout with a line
that names the fix. (The comparisons are in tests/test_parity_<method>.py.)"""

from __future__ import annotations

import importlib
import subprocess

import pytest
import torch

from parity.common import FIXTURES, ROOT, count_sketch, gradient_errors, gradient_record, read_fixture
from parity.common import load_loop, require_checkout, seeded_weights

GENERATORS = sorted(p.stem for p in (ROOT / "parity").glob("*.py") if p.stem not in ("__init__", "common", "mutations"))
DOC = (ROOT / "docs" / "parity.md").read_text()


def test_at_least_ten_methods_are_proven_against_their_authors_code():
    assert len(GENERATORS) >= 10, GENERATORS


@pytest.mark.parametrize("name", GENERATORS)
def test_every_generator_has_its_fixture_test_and_documented_row(name):
    generator = importlib.import_module(f"parity.{name}")  # must not import the authors' code at import time
    fixture = read_fixture(name)
    assert fixture.meta["repository"] == generator.REPOSITORY
    assert fixture.meta["commit"] == generator.COMMIT and len(generator.COMMIT) == 40
    assert fixture.meta["generator"] == f"parity/{name}.py"
    assert (ROOT / "tests" / f"test_parity_{name}.py").is_file()
    assert (FIXTURES / f"{name}.safetensors").stat().st_size < 512 * 1024  # small: numbers, not models
    assert f"`{name}`" in DOC and generator.REPOSITORY in DOC, f"docs/parity.md has no row for {name}"


def test_no_fixture_lacks_a_generator():
    assert sorted(p.stem for p in FIXTURES.glob("*.safetensors")) == GENERATORS


def test_a_checkout_that_is_missing_or_at_another_commit_is_refused_with_the_fix(tmp_path):
    with pytest.raises(SystemExit, match="not a folder"):
        require_checkout(tmp_path / "missing", "0" * 40)
    with pytest.raises(SystemExit, match="--allow-unpinned"):
        require_checkout(tmp_path, "0" * 40)  # not a git checkout
    assert require_checkout(tmp_path, "0" * 40, allow_unpinned=True) == "unknown"
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    with pytest.raises(SystemExit, match="checkout 0000000"):
        require_checkout(tmp_path, "0" * 40)


def test_a_checkout_with_local_changes_is_refused_with_the_fix(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "model.py").write_text("SCALE = 1\n")
    git("add", "model.py")
    git("commit", "-q", "-m", "x")
    head = git("rev-parse", "HEAD")
    assert require_checkout(tmp_path, head) == head  # clean
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"")  # what importing it writes: accepted
    assert require_checkout(tmp_path, head) == head
    (tmp_path / "model.py").write_text("SCALE = 2\n")  # an edit: the commit no longer names the code
    with pytest.raises(SystemExit, match=r"local changes \(model.py\).*stash"):
        require_checkout(tmp_path, head)
    with pytest.raises(SystemExit, match="local changes"):
        require_checkout(tmp_path, head, allow_unpinned=True)  # not even when any commit is allowed
    git("checkout", "--", "model.py")
    (tmp_path / "extra.py").write_text("")  # an untracked module could shadow one of theirs
    with pytest.raises(SystemExit, match=r"local changes \(extra.py\)"):
        require_checkout(tmp_path, head)


def test_gradient_sketches_see_a_small_difference_and_not_rounding():
    g = {"w": torch.randn(64, 64, 3, 3, generator=torch.Generator().manual_seed(0))}
    record = gradient_record(g, full_limit=0)
    assert set(record) == {"grad/w#norm", "grad/w#rows", "grad/w#cs"}
    assert gradient_errors(record, g)["w"] < 1e-7
    off = g["w"].clone()
    off[3] *= 1.05  # one output channel 5 % off: 0.6 % of the gradient's norm
    assert gradient_errors(record, {"w": off})["w"] > 1e-3
    # the count sketch is linear and unbiased: its norm estimates the vector's within about 18 %
    ratios = [float(count_sketch(str(k), g["w"].reshape(-1)).norm() / g["w"].norm()) for k in range(8)]
    assert all(0.6 < r < 1.4 for r in ratios)


def test_seeded_weights_are_reproducible_and_scaled():
    shapes = {"conv.weight": (8, 4, 3, 3), "bn.weight": (8,), "bn.running_var": (8,), "bn.num_batches_tracked": ()}
    a, b = seeded_weights(shapes), seeded_weights(shapes)
    assert all(torch.equal(a[k], b[k]) for k in shapes)
    assert abs(float(a["conv.weight"].std()) - (2 / 36) ** 0.5) < 0.05
    assert bool((a["bn.running_var"] >= 1).all()) and a["bn.num_batches_tracked"].dtype == torch.long


def test_importable_forgets_nested_namespace_packages_whatever_the_order(tmp_path):
    """A checkout whose packages have no __init__.py (FedCCRL's algorithm/client): a namespace package's path is
    recomputed from its parent's, so forgetting the parent first raised KeyError on leaving the block (30 siblings:
    the parent comes before one of them in almost every set order)."""
    import sys

    from parity.common import importable

    for i in range(30):
        (tmp_path / "nspkg" / f"sub{i}").mkdir(parents=True)
        (tmp_path / "nspkg" / f"sub{i}" / "mod.py").write_text("VALUE = 1\n")
    with importable(tmp_path):
        import importlib

        for i in range(30):
            assert importlib.import_module(f"nspkg.sub{i}.mod").VALUE == 1
    assert not any(name == "nspkg" or name.startswith("nspkg.") for name in sys.modules)


def test_an_inline_loop_is_cut_from_a_file_that_does_not_parse(tmp_path):
    """parity.common.load_loop: the authors' train_ELCFS.py holds its step inline and does not parse (a bracket is
    missing at line 58), so the loop is cut from the text; its line numbers stay the file's."""
    script = tmp_path / "train.py"
    script.write_text("names = ['a', 'b'\n"  # the file's own syntax error, as in train_ELCFS.py
                      "if __name__ == '__main__':\n"
                      "    for epoch in range(1):\n"
                      "        for i, batch in enumerate(loader):\n"
                      "            total = total + batch\n"
                      "\n"
                      "            seen.append(i)\n"
                      "        after_the_loop = True\n")
    names = {"loader": [1, 2, 3], "total": 0, "seen": []}
    exec(load_loop(script, "i, batch"), names)
    assert (names["total"], names["seen"], "after_the_loop" in names) == (6, [0, 1, 2], False)
    names["loader"] = [None]
    with pytest.raises(TypeError) as raised:
        exec(load_loop(script, "i, batch"), names)
    assert raised.traceback[-1].lineno + 1 == 5  # the file's line 5 (pytest counts from 0)
    with pytest.raises(SystemExit, match="0 loops"):
        load_loop(script, "j, batch")
