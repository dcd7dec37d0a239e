"""Tests for minialign.model.check_fields, the range checks of every config dataclass."""
import re
from dataclasses import dataclass

import numpy as np
import pytest

from minialign.model import check_fields


@dataclass
class Toy:
    count: object = 1
    rate: object = 0.5


def check(toy):
    check_fields(toy, integers={"count": 1}, numbers={"rate": "in [0, 1)"})


def test_check_fields_accepts_the_edges_and_numpy_scalars():
    for toy in (Toy(1, 0.0), Toy(np.int64(7), np.float32(0.25)), Toy(2, 0)):
        check(toy)


@pytest.mark.parametrize("toy, message", [
    (Toy(0, 0.5), "Toy: count=0 must be an integer >= 1"),
    (Toy(True, 0.5), "Toy: count=True must be an integer >= 1"),       # a bool is not a count
    (Toy(2.0, 0.5), "Toy: count=2.0 must be an integer >= 1"),
    (Toy(1, 1.0), "Toy: rate=1.0 must be a number in [0, 1)"),
    (Toy(1, float("nan")), "Toy: rate=nan must be a number in [0, 1)"),
    (Toy(1, False), "Toy: rate=False must be a number in [0, 1)"),
    (Toy(1, "0.5"), "Toy: rate='0.5' must be a number in [0, 1)"),
])
def test_check_fields_names_class_field_and_range(toy, message):
    with pytest.raises(ValueError) as err:
        check(toy)
    assert str(err.value) == message


def test_check_fields_ranges():
    ok = {"> 0": (1e-9, 0.0), ">= 0": (0.0, -1e-9), "in [0, 1]": (1.0, 1.5)}
    for allowed, (inside, outside) in ok.items():
        check_fields(Toy(rate=inside), numbers={"rate": allowed})
        with pytest.raises(ValueError, match=re.escape(f"rate={outside} must be a number {allowed}")):
            check_fields(Toy(rate=outside), numbers={"rate": allowed})


def test_check_fields_choices():
    check_fields(Toy(rate="a"), choices={"rate": ("a", "b")})
    with pytest.raises(ValueError, match=re.escape("Toy: rate='c' must be one of a, b")):
        check_fields(Toy(rate="c"), choices={"rate": ("a", "b")})
