"""The CLI's torch-free catalog (fedstyle/cli/catalog.json) is the registries' copy: rebuilt from them, it
must equal the stored file, or the command line would list or accept names the library does not have."""

from __future__ import annotations

from fedstyle.algorithms import METHODS
from fedstyle.algorithms.base import FAMILIES
from fedstyle.cli import catalog


def test_the_stored_catalog_is_the_registries():
    built = catalog.render(catalog.build())
    stored = catalog.CATALOG_FILE.read_text(encoding="utf-8")
    assert built == stored, f"fedstyle/cli/catalog.json is stale: run `{catalog.REBUILD}` and commit it"


def test_every_method_says_its_family_and_what_it_shares():
    for name, cls in METHODS.items():
        assert cls.family in FAMILIES, f"{name}.family {cls.family!r} is not one of {FAMILIES}"
        assert cls.shares.startswith("weights"), name


def test_known_domains_match_the_generators():
    """The registry states digits4's and fashion4's domains so --target is checked without building them."""
    from fedstyle.data import DATASETS, digits4, fashion4

    assert DATASETS.get("digits4").domains == tuple(digits4.DOMAINS)
    assert DATASETS.get("fashion4").domains == tuple(fashion4.DOMAINS)


def test_short_cite_keeps_the_first_author_and_the_venue():
    assert catalog.short_cite("Chen et al., Federated domain generalization ..., WACV 2023") == "Chen et al., WACV 2023"
    assert catalog.short_cite("Zhang, Lei, Shi, Federated learning with DG, arXiv 2111.10487, 2021") == \
        "Zhang et al., arXiv 2111.10487, 2021"
    assert catalog.short_cite("FedGCA: Federated Global Consistent Augmentation, arXiv:2409.14671, 2024") == \
        "arXiv:2409.14671, 2024"
