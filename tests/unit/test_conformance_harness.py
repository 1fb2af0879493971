"""The conformance harness's verdict (tests/integration/test_durable_streams_conformance.py) on
made-up vitest reports: it passes only a clean run of the whole suite, the subscription group
included (nothing skipped)."""

from __future__ import annotations

import pytest

from tests.integration.test_durable_streams_conformance import (
    EXPECTED_PASSED,
    SUBSCRIPTIONS,
    check,
)
from tests.support.node import VitestReport, VitestResult

GROUP = 6  # tests of the made-up subscription group


def _report(
    *,
    failed: int = 0,
    extra_skip: bool = False,
    subs: int = GROUP,
    subs_status: str = "passed",
    passed: int = EXPECTED_PASSED - GROUP,
) -> VitestReport:
    results = [
        VitestResult("fetch-auth.test.mjs", ("setup",), f"t{i}", "passed", "") for i in range(5)
    ]
    results += [
        VitestResult("conformance.test.mjs", ("Group",), f"p{i}", "passed", "")
        for i in range(passed)
    ]
    results += [
        VitestResult(
            "conformance.test.mjs", ("Group",), f"f{i}", "failed", "AssertionError: no\nat"
        )
        for i in range(failed)
    ]
    results += [
        VitestResult("conformance.test.mjs", (SUBSCRIPTIONS,), f"s{i}", subs_status, "")
        for i in range(subs)
    ]
    if extra_skip:
        results.append(VitestResult("conformance.test.mjs", ("Other",), "x", "skipped", ""))
    return VitestReport(results, 0 if not failed else 1, "", 1.0)


def test_a_clean_run_passes() -> None:
    check(_report())


@pytest.mark.parametrize(
    "report",
    [
        _report(failed=1),  # a failure
        _report(extra_skip=True),  # a skip outside the subscription group
        _report(subs_status="skipped", passed=EXPECTED_PASSED),  # the group skipped
        _report(subs=0, passed=EXPECTED_PASSED),  # no subscription group (the suite changed)
        _report(passed=EXPECTED_PASSED - GROUP - 1),  # fewer tests ran
    ],
)
def test_anything_else_fails(report: VitestReport) -> None:
    with pytest.raises(AssertionError):
        check(report)


def test_the_summary_names_the_failures() -> None:
    summary = VitestReport.summary(_report(failed=2).of("conformance.test.mjs"))
    assert summary.startswith(f"{EXPECTED_PASSED} passed, 2 failed")
    assert "FAILED Group > f1: AssertionError: no" in summary


def test_a_setup_failure_fails() -> None:
    report = _report()
    report.results[0] = VitestResult("fetch-auth.test.mjs", ("setup",), "t0", "failed", "x")
    with pytest.raises(AssertionError):
        check(report)
