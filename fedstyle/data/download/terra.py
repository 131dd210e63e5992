"""TerraIncognita as DomainBed builds it from the Caltech Camera Traps files.

DomainBed (``domainbed/scripts/download.py``, ``download_terra_incognita``) keeps the images of
four camera locations (38, 46, 100, 43: the domains) whose annotation is one of ten categories,
and files each as ``location_<L>/<category>/<file name>``; an image annotated with two kept
categories is filed under both. Inputs: the CCT-20 benchmark images
(``eccv_18_all_images_sm/``) and the image-level labels (the ``caltech_images_*.json`` inside
``caltech_camera_traps.json.zip``, COCO Camera Traps format: ``images`` with ``location`` and
``file_name``, ``annotations`` with ``image_id`` and ``category_id``, ``categories``).

Where DomainBed would stop on an annotated image missing from the image archive, this arrangement
leaves it out and says how many were left out.
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


def _labels_file(unpacked: Path) -> Path:
    candidates = sorted(unpacked.rglob("*.json"), key=lambda p: p.stat().st_size, reverse=True)
    for path in candidates:
        if path.name.startswith("caltech_images"):
            return path
    if candidates:
        return candidates[0]
    raise DataError(f"no labels .json in {unpacked} (caltech_camera_traps.json.zip holds caltech_images_*.json)")


def arrange_terra_incognita(unpacked: Path, result: Path, domains: tuple[str, ...] = ()) -> dict[str, int]:
    """File the kept images into ``result/location_<L>/<category>/``; returns images per location."""
    images = next((p for p in unpacked.rglob(IMAGES_FOLDER) if p.is_dir()), None)
    if images is None:
        raise DataError(f"no {IMAGES_FOLDER}/ folder in the unpacked eccv_18_all_images_sm.tar.gz")
    labels_path = _labels_file(unpacked)
    try:
        labels = json.loads(labels_path.read_text())
        names = {c["id"]: c["name"] for c in labels["categories"]}
        kept_by_image: dict[object, set[str]] = defaultdict(set)
        for note in labels["annotations"]:
            if names.get(note["category_id"]) in CATEGORIES:
                kept_by_image[note["image_id"]].add(names[note["category_id"]])
        records = labels["images"]
    except (ValueError, KeyError, TypeError) as err:
        raise DataError(f"{labels_path.name} is not a COCO Camera Traps label file ({err})") from None
    counts: dict[str, int] = defaultdict(int)
    missing = 0
    for image in records:
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
