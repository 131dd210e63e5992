"""A method keeps one colour in every figure: fixed for registered methods, hash-stable for other labels."""

import subprocess
import sys

from fedstyle.algorithms import METHODS
from fedstyle.colours import METHOD_COLOURS, PALETTE, colour_for


def test_every_registered_method_has_its_own_fixed_colour():
    names = list(METHODS)
    assert set(names) <= set(METHOD_COLOURS), f"no colour for {set(names) - set(METHOD_COLOURS)}"
    assert len(set(METHOD_COLOURS.values())) == len(METHOD_COLOURS), "two methods share a colour"


def test_labels_and_names_of_one_method_share_its_colour():
    assert colour_for("FedAvg") == colour_for("fedavg") == PALETTE[0]
    assert colour_for("FedDG-FFT") == colour_for("feddg_fft")


def test_other_labels_keep_their_colour_across_processes():
    label = "CCST + MixStyle (FixBN)"
    other = subprocess.run([sys.executable, "-c", f"from fedstyle.colours import colour_for; print(colour_for({label!r}))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert other == colour_for(label) and other in PALETTE


def test_a_row_within_ten_points_of_chance_did_not_learn():
    from fedstyle.experiments.verdict import learned
    assert not learned(19.9, 10) and not learned(20.0, 10) and learned(20.1, 10)
    assert not learned(35.0, 4) and learned(35.1, 4)
