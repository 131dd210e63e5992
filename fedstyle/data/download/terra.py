"""TerraIncognita as DomainBed builds it from the Caltech Camera Traps (CCT-20) files.

This follows DomainBed's current recipe (``domainbed/scripts/download.py``, ``download_terra_incognita``,
as changed in June 2024 by commit 3cf2e20, "Fix TerraIncognita download"; unchanged at b93c22a):

- the images: ``eccv_18_all_images_sm.tar.gz``, which unpacks to ``eccv_18_all_images_sm/``;
- the labels: ``eccv_18_annotations.tar.gz``, which unpacks to ``eccv_18_annotation_files/`` holding five
  COCO Camera Traps files (``cis_test``, ``cis_val``, ``train``, ``trans_test``, ``trans_val``
  ``_annotations.json``). DomainBed merges them key by key (each file's ``images``, ``annotations`` and
  ``categories`` lists are concatenated), and so does this module.

The images of four camera locations (38, 46, 100, 43: the domains) whose annotation is one of ten categories
are filed as ``location_<L>/<category>/<file name>``; an image annotated with two kept categories is filed
under both. Before June 2024 DomainBed read ``caltech_camera_traps.json.zip`` from a host that no longer
serves it (DomainBed issue #136); that recipe is gone here too.

One difference: where DomainBed stops on an annotated image missing from the image archive, this
arrangement leaves it out and says how many were left out.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import defaultdict
from pathlib import Path

from fedstyle.errors import DataError

LOCATIONS = ("38", "46", "100", "43")
CATEGORIES = ("bird", "bobcat", "cat", "coyote", "dog", "empty", "opossum", "rabbit", "raccoon", "squirrel")
IMAGES_FOLDER = "eccv_18_all_images_sm"
ANNOTATIONS_FOLDER = "eccv_18_annotation_files"
#: the five label files DomainBed merges, in its order
ANNOTATION_FILES = ("cis_test_annotations.json", "cis_val_annotations.json", "train_annotations.json",
                    "trans_test_annotations.json", "trans_val_annotations.json")


def _folder(unpacked: Path, name: str, archive: str) -> Path:
    found = next((p for p in unpacked.rglob(name) if p.is_dir()), None)
    if found is None:
        raise DataError(f"no {name}/ folder in the unpacked {archive}; the archives are not the Caltech Camera "
                        "Traps files DomainBed uses")
    return found


def merged_labels(folder: Path) -> dict[str, list]:
    """The five label files merged as DomainBed merges them: every list-valued key concatenated, in file order."""
    merged: dict[str, list] = defaultdict(list)
    for name in ANNOTATION_FILES:
        path = folder / name
        if not path.is_file():
            raise DataError(f"{path} is missing: eccv_18_annotations.tar.gz holds {', '.join(ANNOTATION_FILES)}; "
                            "download it again")
        try:
            labels = json.loads(path.read_text())
        except ValueError as err:
            raise DataError(f"{path} is not JSON ({err}); download eccv_18_annotations.tar.gz again") from None
        if not isinstance(labels, dict):
            raise DataError(f"{path} is not a COCO Camera Traps label file (no object at the top)")
        for key, value in labels.items():
            if isinstance(value, list):  # "info" is an object; DomainBed's extend never reads it
                merged[key].extend(value)
    return dict(merged)


def arrange_terra_incognita(unpacked: Path, result: Path, domains: tuple[str, ...] = ()) -> dict[str, int]:
    """File the kept images into ``result/location_<L>/<category>/``; returns images filed per location."""
    images = _folder(unpacked, IMAGES_FOLDER, "eccv_18_all_images_sm.tar.gz")
    labels_folder = _folder(unpacked, ANNOTATIONS_FOLDER, "eccv_18_annotations.tar.gz")
    labels = merged_labels(labels_folder)
    try:
        names = {c["id"]: c["name"] for c in labels["categories"]}
        kept_by_image: dict[object, set[str]] = defaultdict(set)
        for note in labels["annotations"]:
            if names.get(note["category_id"]) in CATEGORIES:
                kept_by_image[note["image_id"]].add(names[note["category_id"]])
        records = {image["id"]: image for image in labels["images"]}  # an image in two files is filed once
    except (KeyError, TypeError) as err:
        raise DataError(f"the files in {labels_folder} are not COCO Camera Traps label files (missing {err})") from None
    counts: dict[str, int] = defaultdict(int)
    missing = 0
    for image in records.values():
        location = str(image.get("location"))
        if location not in LOCATIONS or image["id"] not in kept_by_image:
            continue
        source = images / image["file_name"]
        if not source.is_file():
            missing += 1
            continue
        categories = sorted(kept_by_image[image["id"]])
        for index, category in enumerate(categories):
            folder = result / f"location_{location}" / category
            folder.mkdir(parents=True, exist_ok=True)
            last = index == len(categories) - 1
            (os.replace if last else shutil.copyfile)(source, folder / Path(image["file_name"]).name)
            counts[location] += 1
    absent = [d for d in domains if not (result / d).is_dir()]
    if absent:
        raise DataError(f"the TerraIncognita labels give no image for {', '.join(absent)}; "
                        f"the archives are not the Caltech Camera Traps files DomainBed uses")
    if missing:
        print(f"fedstyle: {missing} labelled image(s) of the kept locations are not in {IMAGES_FOLDER}/ "
              "and are left out", file=sys.stderr)
    return dict(counts)
