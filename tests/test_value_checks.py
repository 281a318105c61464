"""Option checks shared by the iterator, the bench and the pipelines."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from lerobot_dali.bench import BenchMode
from lerobot_dali.cpu_decode import ColorConversion, CpuDecodeOptions, CpuDecoderBackend
from lerobot_dali.decode_route import DecodePreference
from lerobot_dali.depth_maps import DepthUnit
from lerobot_dali.errors import ResumeStateError
from lerobot_dali.frame_lookup import FrameLookup, TimestampSource
from lerobot_dali.sample_order import RankBalance
from lerobot_dali.value_checks import (
    check_choice,
    check_int,
    check_int_fields,
    check_seconds,
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


@pytest.mark.parametrize(
    "kind", [CpuDecoderBackend, ColorConversion, TimestampSource, RankBalance, DepthUnit, DecodePreference, BenchMode]
)
def test_every_option_enum_takes_its_values_as_strings_in_any_case(kind) -> None:
    """The public options typed by these enums take their members, or their values as strings, in any case (the
    iterator's decode= took strings while CpuDecodeOptions refused "pyav"; timestamp_source="FRAME_INDEX" and
    depth_unit="MM" were refused); an unknown string is refused naming every value."""
    for member in kind:
        for given in (member, member.value, member.value.upper(), member.value.title()):
            assert check_choice(kind, "option", given) is member, given
    allowed = ", ".join(repr(member.value) for member in kind)
    for wrong in ("nope", "", None, 1, [member.value for member in kind][:1]):
        with pytest.raises(ValueError, match=rf"^option must be one of {re.escape(allowed)}, got "):
            check_choice(kind, "option", wrong)


def test_cpu_decode_options_take_strings_and_keep_members() -> None:
    options = CpuDecodeOptions(backend="PyAV", color_conversion="graph")  # type: ignore[arg-type]
    assert options.backend is CpuDecoderBackend.PYAV and options.color_conversion is ColorConversion.GRAPH
    assert options == CpuDecodeOptions(backend=CpuDecoderBackend.PYAV, color_conversion=ColorConversion.GRAPH)
    assert CpuDecodeOptions(backend="torchcodec").backend is CpuDecoderBackend.TORCHCODEC  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^backend must be one of 'auto', 'pyav', 'torchcodec', got 'ffmpeg'$"):
        CpuDecodeOptions(backend="ffmpeg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^color_conversion must be one of 'auto', 'worker', 'graph', got 'gpu'$"):
        CpuDecodeOptions(color_conversion="gpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="torchcodec does not hand over"):  # (checked on the members the strings name)
        CpuDecodeOptions(backend="TORCHCODEC", color_conversion="Graph")  # type: ignore[arg-type]


def test_a_tolerance_of_zero_is_refused_with_why() -> None:
    """0 passed every check, and a row read by frame_index / fps at its own frame failed with "no video frame within
    tolerance_s=0 (... off by 0.000000 s)": its time and the frame's differ by float rounding alone."""
    assert 0.2 + 5 / 30 != 5632 / 15360  # (the rounding: episode 1 of 6-frame episodes at 30 fps, frame 11's pts)
    assert check_seconds("tolerance_s", np.float32(1e-4)) == pytest.approx(1e-4)
    for zero in (0, 0.0, -0.0, np.float64(0)):
        with pytest.raises(ValueError, match=r"^tolerance_s must be more than 0 seconds: .*tolerance_s=1e-4"):
            check_seconds("tolerance_s", zero)
        with pytest.raises(ValueError, match="tolerance_s must be more than 0"):
            FrameLookup(tolerance_s=zero)
    for wrong in (-1e-4, float("nan"), float("inf"), "1e-4", True, None):
        with pytest.raises(ValueError, match=r"^tolerance_s must be a positive finite number of seconds"):
            check_seconds("tolerance_s", wrong)
