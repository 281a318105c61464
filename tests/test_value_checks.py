"""Option checks shared by the iterator, the bench and the pipelines."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from lerobot_dali.errors import ResumeStateError
from lerobot_dali.value_checks import (
    check_int,
    check_int_fields,
    cli_flag,
    is_int,
    is_number,
    required_whole_number,
    whole_number,
)


def test_bool_is_neither_int_nor_number() -> None:
    assert [is_int(v) for v in (3, np.int64(3), True, 3.0, "3")] == [True, True, False, False, False]
    assert [is_number(v) for v in (3, 2.5, np.float64(2.5), False, float("nan"), float("inf"))] == [
        True, True, True, False, False, False,
    ]  # fmt: skip
    numpy = (np.float32(2.5), np.int64(3), np.uint8(3), np.bool_(True), np.float32("nan"), np.array([2.5]))
    assert [is_number(v) for v in numpy] == [True, True, True, False, False, False]


def test_whole_number_takes_what_lerobot_takes_and_cuts_nothing() -> None:
    taken = [4, np.int64(4), "4", " 4 ", 4.0, np.float32(4.0), "4.0", 2**60 + 1, str(2**60 + 1)]
    assert [whole_number(v) for v in taken] == [4] * 7 + [2**60 + 1] * 2  # (a float's 53 bits would cut the last two)
    refused = [2.5, "2.5", True, None, [4], "four", float("nan"), float("inf"), "inf"]
    assert [whole_number(v) for v in refused] == [None] * len(refused)


def test_required_whole_number_names_what_is_not_one() -> None:
    assert required_whole_number("length", "20") == 20
    with pytest.raises(ValueError, match=r"length must be a whole number, got 20\.5"):
        required_whole_number("length", 20.5)


def test_check_int_tells_type_from_range() -> None:
    assert check_int("n", np.int32(4), minimum=1) == 4
    with pytest.raises(TypeError, match=r"n must be an int, got bool \(True\)"):
        check_int("n", True, minimum=0)
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        check_int("n", 0, minimum=1)


def test_check_int_fields_names_the_first_bad_field() -> None:
    options = SimpleNamespace(batch_size=8, num_workers=-1, chunk=None, steps=2.0)
    checked = (("batch_size", 1), ("chunk", 1), ("num_workers", 0), ("steps", 1))
    with pytest.raises(ValueError, match="^--num-workers must be an int >= 0, got -1$"):
        check_int_fields(options, checked, label=cli_flag, optional=("chunk",))
    options.num_workers = 0
    with pytest.raises(ValueError, match=r"^--steps must be an int >= 1, got 2\.0$"):
        check_int_fields(options, checked, label=cli_flag, optional=("chunk",))
    with pytest.raises(ResumeStateError, match="^field 'chunk' must be an int >= 1, got None$"):
        check_int_fields(options, checked[:2], label="field {!r}".format, error=ResumeStateError)
    options.steps = 2
    check_int_fields(options, checked, label=cli_flag, optional=("chunk",))
