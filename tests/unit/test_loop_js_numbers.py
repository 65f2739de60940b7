"""/loop's texts write numbers as the reference's JavaScript does (``String(x)``): ``1e+25d``, not the float's
exact integer. The expected strings are node's (v18) for the same numbers."""

from __future__ import annotations

import pytest

from loopd_es.domain.loop.jsclass import js_text
from loopd_es.domain.loop.texts import display_interval

NODE = {
    1e25: "1e+25",
    8.64e29: "8.64e+29",
    100.0: "100",
    0.001: "0.001",
    1.5: "1.5",
    12345678901234567000.0: "12345678901234567000",
    1e-7: "1e-7",
    1e21: "1e+21",
    1e20: "100000000000000000000",
    123.456: "123.456",
    0.000001: "0.000001",
    2.5e-7: "2.5e-7",
    8.64e26: "8.64e+26",
    115740740740740750.0: "115740740740740750",
    -42.0: "-42",
    0.0: "0",
    float("inf"): "Infinity",
}


@pytest.mark.parametrize(("number", "text"), NODE.items())
def test_numbers_are_written_as_javascript_writes_them(number: float, text: str) -> None:
    assert js_text(number) == text


def test_a_huge_interval_is_shown_as_the_reference_shows_it() -> None:
    """``/loop 9999999999999999999999999d x`` says ``every 1e+25d``; ``loop list`` says ``every 8.64e+29s``."""
    assert display_interval(9999999999999999999999999 * 86_400_000) == "1e+25d"
    assert display_interval(90_000) == "2m" and display_interval(1_500) == "2s"
