"""Jitter, random fallback and clamp: the reference's test vectors, bit for bit
(docs/reference/loop-plugin.md#s3-5, #s3-6; scenario 12)."""

from __future__ import annotations

import pytest

from loopd_es.domain.loop.jitter import (
    clamp_due,
    fallback_due,
    fnv1a,
    jitter_offset,
    js_round,
    normalise_bounds,
)

T = 1_800_000_000_000

VECTORS = [
    ("abc12345", 30_000, T, 3),
    ("abc12345", 30_000, T + 30_000, 6_674),
    ("abc12345", 60_000, T, 14_867),
    ("abc12345", 300_000, T, 12_525),
    ("abc12345", 300_000, T + 1_000, 12_525),
    ("abc12345", 300_000, T + 300_000, -10_803),
    ("abc12345", 600_000, T, 17_621),
    ("abc12345", 1_800_000, T, -57_020),
    ("abc12345", 3_600_000, T, -1_021_622),
    ("abc12345", 3_600_000, T + 3_600_000, 1_777_806),
    ("abc12345", 86_400_000, T, 1_742_958),
    ("a1b2c3d4", 10_000, T, -269),
    ("a1b2c3d4", 120_000, T, 14_667),
    ("a1b2c3d4", 7_200_000, T, -1_555_686),
]


@pytest.mark.parametrize(("task_id", "interval", "at", "offset"), VECTORS)
def test_reference_vectors(task_id: str, interval: int, at: int, offset: int) -> None:
    assert jitter_offset(task_id, interval, at) == offset


def test_fnv1a_hashes_of_the_table() -> None:
    assert fnv1a("abc12345-60000000") == 4_166_500_091
    assert fnv1a("abc12345-6000000") == 63_917_513
    assert fnv1a("abc12345-3000000") == 900_793_690
    assert fnv1a("abc12345-500000") == 3_551_216_216
    assert fnv1a("a1b2c3d4-180000000") == 3_234_473_147


def test_half_up_rounding_differs_from_python_round() -> None:
    assert js_round(2.5) == 3 and round(2.5) == 2
    assert js_round(-2.5) == -2 and js_round(-2.6) == -3


def test_short_tier_never_exceeds_half_the_interval() -> None:
    for at in range(T, T + 200_000, 1000):
        assert abs(jitter_offset("zz", 1000, at)) <= 500


def test_fallback_and_clamp_examples() -> None:
    assert [fallback_due(10_000, 1_000, 3_000, u) for u in (0, 0.5, 0.999999)] == [11_000, 12_000, 13_000]
    assert fallback_due(0, 60_000, 3_600_000, 0.5) == 1_830_000
    assert fallback_due(0, 1_000, 3_000, float("nan")) == 1_000
    assert [clamp_due(10_000, r, 1_000, 3_000) for r in (10_500, 12_000, 15_000)] == [11_000, 12_000, 13_000]
    assert clamp_due(10_000, float("inf"), 1_000, 3_000) == 11_000
    assert normalise_bounds(4_000, 1_000) == (1_000, 4_000)
    assert normalise_bounds(float("nan"), None) == (60_000, 3_600_000)
