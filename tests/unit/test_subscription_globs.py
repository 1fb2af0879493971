"""A subscription's glob decided in Python (`domain.subscriptions.matches`) says what its
regular expression says in PostgreSQL (`pattern_regex`), without backtracking: a glob that
fails against a long ID fails at once instead of holding the event loop."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from domain.subscriptions import StreamPath, check_pattern, matches, pattern_regex

IDS = st.text(alphabet="ab:", min_size=1, max_size=5).filter(lambda s: s[0] != ":")
SEGMENTS = st.one_of(
    st.just("**"),
    st.text(alphabet="ab:*", min_size=1, max_size=5).filter(lambda s: "**" not in s),
)


def by_regex(pattern: str, path: StreamPath) -> bool:
    regex = re.compile(pattern_regex(pattern))
    return bool(regex.match(path.path) or regex.match(f"{path.run_id}/{path.stream_id}"))


@given(
    st.lists(SEGMENTS, min_size=1, max_size=4),
    st.one_of(st.just("default"), IDS),
    IDS,
)
def test_the_glob_says_what_its_regular_expression_says(
    segments: list[str], run_id: str, stream_id: str
) -> None:
    pattern = check_pattern("/".join(segments))
    path = StreamPath(run_id, stream_id)
    assert matches(pattern, path) == by_regex(pattern, path)


def test_a_glob_that_fails_against_a_long_id_fails_at_once() -> None:
    long_id = "".join(c * 18 for c in "default")  # 126 characters
    for run_id in ("default", "run"):
        assert not matches("*d*e*f*a*u*l*t*x", StreamPath(run_id, long_id))
        assert not matches("*/*d*e*f*a*u*l*t*x*", StreamPath(run_id, long_id))
        assert matches("*/*d*e*f*a*u*l*t*", StreamPath(run_id, long_id))
    assert matches("*d*e*f*a*u*l*t*", StreamPath("default", long_id))


def test_a_pull_wake_never_watches_its_own_wake_stream() -> None:
    """A wake stream its pattern or streams name would be woken by each wake event written to
    it: every wake would cause another. Refused (400), by the pattern and by name."""
    import pytest

    from domain.errors import InvalidInput
    from domain.subscriptions import SubscriptionRequest, configure

    for request in (
        SubscriptionRequest(type="pull-wake", pattern="ev/*", wake_stream="ev/wakes"),
        SubscriptionRequest(type="pull-wake", streams=["ev/a", "ev/wakes"], wake_stream="ev/wakes"),
        SubscriptionRequest(type="pull-wake", pattern="*", wake_stream="wakes"),
    ):
        with pytest.raises(InvalidInput) as refused:
            configure(request)
        assert refused.value.extra["field"] == "wake_stream"
    kept = configure(SubscriptionRequest(type="pull-wake", pattern="ev/*", wake_stream="w/wakes"))
    assert kept.wake_stream is not None
