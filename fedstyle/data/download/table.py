"""Where each benchmark's archives come from, what their bytes hash to, and where they go.

The URLs are DomainBed's (``domainbed/scripts/download.py`` at b93c22a, December 2024; TerraIncognita's
as changed in June 2024 by commit 3cf2e20) for PACS, VLCS, Office-Home, DomainNet and TerraIncognita,
and WILDS's (``wilds/datasets/camelyon17_dataset.py``, v1.0) for Camelyon17; further sources of the
same file are listed after them and tried in order.

Checksums: an archive's SHA-256 (and size) is written here only where a public source states it:
DomainNet's six zips and its twelve split lists are hashed in TensorFlow Datasets'
``tensorflow_datasets/image_classification/domainnet/checksums.tsv``. Nobody publishes a hash of
the Google Drive archives of PACS, VLCS and Office-Home, of the TerraIncognita (Caltech Camera
Traps) files or of WILDS's Camelyon17 archive (WILDS records only an approximate compressed size),
and none is invented here: those entries say ``sha256=None`` and are checked *on first use* — the
first complete download that also extracts cleanly has its SHA-256 recorded in
``DATA_ROOT/fedstyle-downloads.json``, and any later download of that archive into the same data
root must match it. Compare that record with a colleague's copy to close the gap.

``FEDSTYLE_DOWNLOAD_SOURCES`` (a JSON file ``{"PACS.zip": {"urls": [...], "sha256": "...",
"size": N}}``) replaces the sources and checksums of the archives it names: a local mirror for an
air-gapped site, or a loopback server in the tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from fedstyle.data.folder import BENCHMARKS
from fedstyle.errors import ConfigError
from fedstyle.registry import Registry

SOURCES_ENV = "FEDSTYLE_DOWNLOAD_SOURCES"


def google_drive(file_id: str) -> tuple[str, ...]:
    """A Drive file's direct download (no virus-scan page for large files), then DomainBed's own URL."""
    return (f"https://drive.usercontent.google.com/download?id={file_id}&export=download&confirm=t",
            f"https://drive.google.com/uc?id={file_id}&export=download")


@dataclass(frozen=True)
class Archive:
    """One file to fetch: its local name, sources in order, and its published SHA-256 and size (or None)."""

    filename: str
    urls: tuple[str, ...]
    sha256: str | None = None
    size: int | None = None
    origin: str = ""  # who publishes the file (for the manual step)

    @property
    def checksum_text(self) -> str:
        if self.sha256:
            return f"sha256 {self.sha256[:12]}… (published)"
        return "checksum unknown — verified on first download and recorded in the data root"


@dataclass(frozen=True)
class DatasetDownload:
    """A benchmark as ``fedstyle data download NAME`` installs it: ``DATA_ROOT/<folder>``.

    ``layout`` names how the unpacked archives become the folder (see ``download.layout``);
    ``domains``: the domain folders the result must hold; ``dataset``: the ``--dataset`` name that
    reads it; ``alternative``: another way to the data when every source fails; ``removed``: a list
    shipped in ``download/lists/`` naming files (relative to the folder) that are deleted after
    unpacking, as the source's own recipe deletes them.
    """

    name: str
    title: str
    folder: str
    archives: tuple[Archive, ...]
    layout: str
    domains: tuple[str, ...] = ()
    dataset: str = ""
    alternative: str = ""
    removed: str = ""

    def archive(self, filename: str) -> Archive:
        return next(a for a in self.archives if a.filename == filename)


DOWNLOADS: Registry[DatasetDownload] = Registry("downloadable dataset")

DOMAINBED = "DomainBed's copy"
#: DomainBed's list of the 9,431 DomainNet images its download.py deletes (lists/README.md says where it is from)
DOMAINNET_DUPLICATES = "domain_net_duplicates.txt"
DOMAINNET_BASE = "http://csr.bu.edu/ftp/visda/2019/multi-source"
#: (path under DOMAINNET_BASE, size in bytes, SHA-256), as TensorFlow Datasets' checksums.tsv records them
DOMAINNET_FILES = (
    ("groundtruth/clipart.zip", 1270909081, "f8f248a3e8bbc9868c523ae24e6601b4c2ad102afc60c0efeb4f3255df22354d"),
    ("infograph.zip", 4338659804, "891e14f476317e97b6f06d6498c11d0a5b8d0c8b57210765ed9beb072da611fa"),
    ("groundtruth/painting.zip", 3679366174, "fa47e6d405503ea0286cabd767f176bd30e988b63ddd7b9db16cf030c9770015"),
    ("quickdraw.zip", 459920701, "9f37df2a8c3733703dbb35ad9964202a65f675ca30137756457537536b485d84"),
    ("real.zip", 6062039589, "d7fe010b430c5b510f85d657d38c4a1924822695fabea4fef57bd00dba251d63"),
    ("sketch.zip", 2633992926, "23a7dbae7016b343e934399beaa8a68728fb5e570ebe2c71df9b75cf91c499fc"),
    ("domainnet/txt/clipart_train.txt", 1443819, "affdadf5f95a7583e6b98030a3d35007e2613ee4dd942393c5a705ec2b429312"),
    ("domainnet/txt/clipart_test.txt", 628917, "62c8e36aaba1c41ad9e249099739707220a44c08f167b37ef420f34a31628a6b"),
    ("domainnet/txt/infograph_train.txt", 1683098, "36b44cbd41a2915e0dc73b4f4be8862a6f3c220f93c8d63fb2439beeae3aefda"),
    ("domainnet/txt/infograph_test.txt", 728028, "413cfa54ac92e7e6b242f4f09fbd9c8ace85c4deaf3cb6c81ff6b68264460136"),
    ("domainnet/txt/painting_train.txt", 2241901, "f1da38d50a702fddf1329f85bc607d7a2abcae7e6aec75e1fd49cc1bd340d47b"),
    ("domainnet/txt/painting_test.txt", 971888, "11472b13b5188e09f06918b12eebb660588c97a20e43e268d9b02e3e37eb8f97"),
    ("domainnet/txt/quickdraw_train.txt", 5164600, "3a5edd3bc215772010eebc87f158707703dd7e48091d13b816af81326a9d1c0f"),
    ("domainnet/txt/quickdraw_test.txt", 2213400, "2a00a60650a453c65c356da748fec54084a197272137c440e7d52d08947357bf"),
    ("domainnet/txt/real_train.txt", 4440944, "19d483256d24aef19e581b65eda8333fd918aef3eb733fe499ff384120e3a289"),
    ("domainnet/txt/real_test.txt", 1911327, "2b3f75bcde309aeb5931292084b2162e936b5f189e3bb1ad716f0f74c460864c"),
    ("domainnet/txt/sketch_train.txt", 1960222, "72f4bc6afa5702a1ccba800d0053c1427de87439dfaf246dbc9a2e71abfec54f"),
    ("domainnet/txt/sketch_test.txt", 850581, "3fb48fca18c507c4321f007c3f62b308ec232ff6928cbfe2af64e76ec366e840"),
)
#: DomainBed's source of the Caltech Camera Traps files since June 2024 (commit 3cf2e20); its former host,
#: lilablobssc.blob.core.windows.net, no longer serves them (DomainBed issue #136)
LILA = "https://storage.googleapis.com/public-datasets-lila/caltechcameratraps"
CAMELYON_URL = "https://worksheets.codalab.org/rest/bundles/0xe45e15f39fb54e9d9e919556af67aabe/contents/blob/"

for _entry in (
    DatasetDownload(
        "pacs", "PACS (Li et al., 2017)", "PACS",
        (Archive("PACS.zip", google_drive("1JFr8f805nMUelQWWmfnJR3y4_SYoN5Pd"), origin=DOMAINBED),),
        "domain_folders", BENCHMARKS.get("pacs").domains, "pacs",
        "or load Flower's copy from the Hugging Face Hub: --dataset hf:flwrlabs/pacs",
    ),
    DatasetDownload(
        "vlcs", "VLCS (Fang et al., 2013)", "VLCS",
        (Archive("VLCS.tar.gz", google_drive("1skwblH1_okBwxWxmRsp9_qi15hyPpxg8"), origin=DOMAINBED),),
        "domain_folders", BENCHMARKS.get("vlcs").domains, "vlcs",
    ),
    DatasetDownload(
        "officehome", "Office-Home (Venkateswara et al., 2017)", "office_home",
        (Archive("office_home.zip", google_drive("1uY0pj7oFsjMxRwaD3Sxy0jgel0fsYXLC"), origin=DOMAINBED),),
        "domain_folders", BENCHMARKS.get("officehome").domains, "officehome",
        "or load Flower's copy from the Hugging Face Hub: --dataset hf:flwrlabs/office-home",
    ),
    DatasetDownload(
        "domainnet",
        "DomainNet (Peng et al., 2019), with its official train/test lists, less DomainBed's 9,431 duplicates",
        "domain_net",
        tuple(Archive(path.rpartition("/")[2], (f"{DOMAINNET_BASE}/{path}",), sha, size,
                      "DomainNet's authors (http://ai.bu.edu/M3SDA/)")
              for path, size, sha in DOMAINNET_FILES),
        "domain_folders", BENCHMARKS.get("domainnet").domains, "domainnet",
        removed=DOMAINNET_DUPLICATES,
    ),
    DatasetDownload(
        "terra_incognita", "TerraIncognita (Beery et al., 2018), DomainBed's 4 locations x 10 classes",
        "terra_incognita",
        (Archive("eccv_18_all_images_sm.tar.gz", (f"{LILA}/eccv_18_all_images_sm.tar.gz",),
                 origin="LILA BC (https://lila.science/datasets/caltech-camera-traps)"),
         Archive("eccv_18_annotations.tar.gz", (f"{LILA}/eccv_18_annotations.tar.gz",),
                 origin="LILA BC (https://lila.science/datasets/caltech-camera-traps)")),
        "terra_incognita", ("location_100", "location_38", "location_43", "location_46"), "folder",
    ),
    DatasetDownload(
        "camelyon17", "Camelyon17-WILDS v1.0 (Koh et al., 2021): 96 x 96 patches from 5 hospitals",
        "camelyon17_v1.0",
        (Archive("camelyon17_v1.0.tar.gz", (CAMELYON_URL, CAMELYON_URL.replace("https:", "http:", 1)),
                 origin="WILDS (https://wilds.stanford.edu/downloads, its archive.tar.gz)"),),
        "camelyon17", (), "camelyon17",
    ),
):
    DOWNLOADS.add(_entry.name, _entry)


SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
#: URL schemes urllib fetches; a mirror or source must name one (and a host, except file:)
URL_SCHEMES = ("http", "https", "ftp", "file")


def shown(value: Any) -> str:
    """``value`` as JSON writes it (``null``, ``"abc"``, ``true``): the file's own spelling in a message."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def json_kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "true or false", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def check_url(url: Any, where: str, fix: str = "") -> str:
    """``url`` if it is a URL urllib can fetch, else one ConfigError line naming ``where`` and the fix."""
    parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in URL_SCHEMES or not (parts.netloc or parts.scheme == "file"):
        raise ConfigError(f"{where} is {shown(url)}, not a URL: give one such as https://mirror.example.org/domainbed "
                          f"(schemes: {', '.join(URL_SCHEMES)})" + (f"; {fix}" if fix else ""))
    return url


def check_sha256(value: Any, where: str, fix: str) -> str:
    """A SHA-256 as 64 hex digits, lower-cased: ``Get-FileHash`` (PowerShell) prints it in upper case."""
    if not isinstance(value, str) or not SHA256.match(value):
        raise ConfigError(f"{where} is {shown(value)}, not a SHA-256 (64 hex digits, as sha256sum prints it); {fix}")
    return value.lower()


def check_size(value: Any, where: str, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where} is {shown(value)}, not a size in bytes (a positive whole number); {fix}")
    return value


def _override(archive: Archive, given: Any, where: str) -> Archive:
    fix = f"fix {where}" + (f" or unset {SOURCES_ENV}" if where != "sources" else "")
    key = f"{where}: {archive.filename}"
    if not isinstance(given, dict):
        raise ConfigError(f"{key} is {shown(given)}, not an object such as "
                          '{"urls": ["https://..."], "sha256": "...", "size": N}; ' + fix)
    unknown = set(given) - {"urls", "sha256", "size"}
    if unknown:
        raise ConfigError(f"{key} has unknown key {sorted(unknown)[0]!r}; use urls, sha256, size")
    urls = given.get("urls", archive.urls)
    if isinstance(urls, str) or not isinstance(urls, (list, tuple)) or not urls:
        raise ConfigError(f"{key}.urls is {shown(urls)}, not a list of one or more URLs; {fix}")
    urls = tuple(check_url(u, f"{key}.urls[{i}]", fix) for i, u in enumerate(urls))
    sha256 = archive.sha256 if given.get("sha256") is None else check_sha256(given["sha256"], f"{key}.sha256", fix)
    size = archive.size if given.get("size") is None else check_size(given["size"], f"{key}.size", fix)
    return dataclasses.replace(archive, urls=urls, sha256=sha256, size=size)


def read_sources(path: str) -> dict[str, Any]:
    """``$FEDSTYLE_DOWNLOAD_SOURCES``'s JSON object (file name -> its sources), or one ConfigError line."""
    try:
        sources = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{SOURCES_ENV}={path} is no readable JSON file ({err}); fix or unset it") from None
    if not isinstance(sources, dict):
        raise ConfigError(f"{SOURCES_ENV}={path} holds {json_kind(sources)}, not an object mapping file "
                          'names to their sources ({"PACS.zip": {"urls": [...], "sha256": "..."}}); fix or unset it')
    return sources


def with_sources(entry: DatasetDownload, sources: Mapping[str, Mapping[str, Any]] | None = None,
                 mirrors: tuple[str, ...] = ()) -> DatasetDownload:
    """``entry`` with its archives' sources replaced by ``sources`` (else ``$FEDSTYLE_DOWNLOAD_SOURCES``)
    and every ``mirrors`` base URL (``BASE/<file name>``) tried first, in the order given.

    Both are checked first (shapes, URLs, checksums), each fault one :class:`ConfigError` line."""
    where = "sources"
    if sources is None and os.environ.get(SOURCES_ENV):
        where = os.environ[SOURCES_ENV]
        sources = read_sources(where)
    sources = sources or {}
    mirrors = tuple(check_url(m, "--mirror") for m in mirrors)
    archives = []
    for archive in entry.archives:
        if archive.filename in sources:
            archive = _override(archive, sources[archive.filename], where)
        first = tuple(f"{m.rstrip('/')}/{archive.filename}" for m in mirrors)
        archives.append(dataclasses.replace(archive, urls=first + archive.urls))
    return dataclasses.replace(entry, archives=tuple(archives))
