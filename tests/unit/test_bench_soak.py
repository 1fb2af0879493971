"""The soak benchmark's verdicts (bench/soak.py): flat within 20%, sampling points, and the
report's PASS/MISS on made-up samples (the soak itself runs by hand: docs/benchmarks.md)."""

from __future__ import annotations

from bench.soak import Phase, Sample, Table, parse_args, report, targets, within


def test_within_twenty_percent_either_way_and_zero_only_equals_zero() -> None:
    assert within(100, 120) and within(100, 80) and within(0, 0)
    assert not within(100, 121) and not within(100, 79) and not within(0, 1)


def test_sampling_points_are_quarters_of_the_appends() -> None:
    assert targets(400_000) == [(25, 100_000), (50, 200_000), (75, 300_000), (100, 400_000)]


def _phase(name: str, seconds: float, sizes: dict[str, tuple[int, int]]) -> Phase:
    phase = Phase(name, f"({name})", name == "a", {}, appended=1_000, seconds=seconds)
    for percent in (25, 50, 75, 100):
        grow = percent / 50  # 0.5, 1, 1.5, 2 times the size at 50%
        tables = {
            t: Table(rows, int(size * (grow if t == "growing" else 1)), 0, 0)
            for t, (rows, size) in sizes.items()
        }
        phase.samples.append(Sample(percent, percent * 10, percent, 0, tables))
    return phase


def test_report_misses_a_growing_table_and_a_slow_cleanup_phase() -> None:
    args = parse_args(["--appends", "1000"])
    sizes = {"flat": (10, 8192), "growing": (10, 8192)}
    text = report([_phase("a", 10.0, sizes), _phase("b", 8.0, sizes)], args, {})
    assert "MISS (not flat: growing)" in text  # size doubled between 50% and 100%
    rate = next(line for line in text.splitlines() if line.startswith("(a)/(b) append rate"))
    assert rate.split()[-4:] == ["80.0%", ">=", "90%", "MISS"]
    text = report([_phase("a", 10.0, {"flat": (10, 8192)}), _phase("b", 9.5, sizes)], args, {})
    assert "MISS" not in text and text.count("PASS") == 5  # 2 per table of (a), the rate
