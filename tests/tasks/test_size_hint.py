"""`results.size_hint`: the line `cake compress` adds when its .cake file is over 100× the document's text."""

from __future__ import annotations

from cake_cli.tasks.results import SIZE_HINT_RATIO, size_hint

SMALLER = ((8, 600_000), (4, 330_000), (2, 200_000))


def test_just_over_the_ratio_names_the_option_and_sizes():
    line = size_hint(SIZE_HINT_RATIO * 10_000 + 1, 10_000, 16, SMALLER)
    assert line == (
        "the file is 100× the document's text (976.6 KiB for 9.8 KiB): "
        "--kv-bits 8 / 4 / 2 would write about 585.9 KiB / 322.3 KiB / 195.3 KiB (2 bits loses answers: "
        "benchmarks/cache.md)"
    )


def test_at_or_under_the_ratio_says_nothing():
    assert size_hint(SIZE_HINT_RATIO * 10_000, 10_000, 16, SMALLER) is None
    assert size_hint(50 * 10_000, 10_000, 16, SMALLER) is None


def test_nothing_smaller_than_two_bits():
    assert size_hint(10**9, 10, 2, ()) is None
    assert size_hint(10**9, 10, 2, ((1, 5),)) is None  # even given sizes: 2 bits is the smallest option


def test_from_eight_bits_only_the_smaller_options():
    line = size_hint(5_000_000, 1000, 8, SMALLER[1:])
    assert line is not None and line.startswith("the file is 5000× the document's text (4.8 MiB for 1000 B)")
    assert line.endswith(
        "--kv-bits 4 / 2 would write about 322.3 KiB / 195.3 KiB (2 bits loses answers: benchmarks/cache.md)"
    )


def test_empty_document_says_nothing():
    assert size_hint(10**6, 0, 16, SMALLER) is None


def test_the_two_bit_caveat_only_where_two_bits_is_offered():
    line = size_hint(5_000_000, 1000, 16, SMALLER[:2])
    assert line is not None and line.endswith("would write about 585.9 KiB / 322.3 KiB")
