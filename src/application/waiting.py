"""How long anything waits on a backing service: bounded, so a silent network costs seconds.

A network path that goes silent (no RST, no FIN) leaves a connection open that never answers; a
statement on it would wait for its timeout, and asyncpg then waits as long again for the
cancellation it sends through the same dead path. So the wait is bounded where it is made, not
by the driver: the PostgreSQL adapter runs each operation as a task of its own and stops
waiting at the bound, leaving the task to clean up (cancel, roll back, terminate) behind it.

An HTTP request carries a `Budget` (set when it arrives): every wait it makes on PostgreSQL
(a statement, a connection from the pool, a connection attempt, its group's commit) spends from
that one budget, so the request answers 503 within the budget of its arrival however many
operations it makes. Time spent waiting for a client or for a wake signal (a long-poll) is not
spent. The budget belongs to the request's own task: a task it starts (a stream's tail, an
append leader) inherits the context but not the budget, and waits at most the bound per
operation.

A request's task acts for the tenant it authenticated as (`act_for`), and so do the tasks it
starts to do its own work (`acts_like`: its wait raced against its client leaving, its event
stream's writer), but not the shared ones it happens to start (a tail, an append leader): what
it waits on is charged to that tenant (its bodies at the edge, its share of the database's
connections in the PostgreSQL adapter), so that one tenant's flood of requests waits behind
itself rather than in front of everyone.

A write that gave up after its COMMIT was sent has an unknown outcome: it may have committed.
`committing()` marks that point, and such a failure says so (`Unanswered.outcome_unknown`), so
a client is never told it failed and may retry without its idempotency key."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from domain.errors import Backpressure

T = TypeVar("T")

# The default bound on a request's waits on backing services (REQUEST_TIMEOUT_SECONDS).
DEFAULT_SECONDS = 5.0


class Unanswered(TimeoutError):
    """A backing service did not answer within the bound. A TimeoutError, so every handler that
    treats a timeout as an outage (503 with Retry-After) treats this one so too."""

    def __init__(self, what: str, seconds: float, outcome_unknown: bool = False) -> None:
        unknown = "; the write may have been committed" if outcome_unknown else ""
        super().__init__(f"{what} did not answer within {seconds:.1f} s{unknown}")
        self.what = what
        self.seconds = seconds
        self.outcome_unknown = outcome_unknown

    def __reduce__(self) -> tuple[type[Unanswered], tuple[str, float, bool]]:
        # (pickled as itself: it crosses from the process that commits a stream to the one
        # that received the append, adapters/peers.py)
        return Unanswered, (self.what, self.seconds, self.outcome_unknown)


class CommitOutcomeUnknown(ConnectionError):
    """The connection failed after COMMIT was sent: the write may or may not have committed."""

    outcome_unknown = True


class Expired(Exception):
    """A wait on a future reached the bound its timer set (`expire`)."""


def expire(future: asyncio.Future[Any]) -> None:
    """The timer of a bounded wait on `future` (`loop.call_later(seconds, expire, future)`):
    the waiter gets `Expired` unless the future was answered first."""
    if not future.done():
        future.set_exception(Expired())


class Budget:
    __slots__ = (
        "admitted",
        "body_to_come",
        "left",
        "reserved",
        "streamed",
        "task",
        "tenant",
        "turn",
    )

    def __init__(self, seconds: float, body_to_come: bool = False, streamed: bool = False) -> None:
        self.left = seconds
        self.task = asyncio.current_task()
        self.tenant: str | None = None  # whose turns the request takes
        self.turn: _Turns | None = None  # the tenant's turn at work the request holds
        # A request with a body takes its turn once the body is in (`body_arrived`); one whose
        # body is streamed to a store as it comes (an object upload) takes none.
        self.body_to_come = body_to_come
        self.streamed = streamed
        # Admitted with its body to come (`take_turn`), and the tenant's turns that count it
        # until its body is in (`_reserve`).
        self.admitted = False
        self.reserved: _Turns | None = None


class CommitWatch:
    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


_budget: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("budget", default=None)
_commit: contextvars.ContextVar[CommitWatch | None] = contextvars.ContextVar("commit", default=None)
# How the entrypoint ends a wait whose client leaves (`unless_client_leaves`), for a request
# whose body is read: an append waiting for credit under `block` must not go on for nobody.
_leaving: contextvars.ContextVar[Callable[[Awaitable[Any]], Awaitable[Any]] | None] = (
    contextvars.ContextVar("leaving", default=None)
)


class client_watched:  # (named as a function: `with client_watched(...)`)
    """While in it, `until_client_leaves` ends a wait with the entrypoint's error for a client
    that left (the wait cancelled), where the client can be watched (its body read). A class,
    not a generator's context manager: every append enters it."""

    __slots__ = ("_leaving", "_token")

    def __init__(self, unless_client_leaves: Callable[[Awaitable[Any]], Awaitable[Any]]) -> None:
        self._leaving = unless_client_leaves

    def __enter__(self) -> None:
        self._token = _leaving.set(self._leaving)

    def __exit__(self, *_: object) -> None:
        _leaving.reset(self._token)


async def until_client_leaves(awaitable: Awaitable[T]) -> T:
    """`awaitable`, ended by the entrypoint if the request's client leaves meanwhile (where it
    is watched: `client_watched`)."""
    leaving = _leaving.get()
    if leaving is None:
        return await awaitable
    result: T = await leaving(awaitable)
    return result


_bound = [DEFAULT_SECONDS]


def configure(seconds: float) -> None:
    """The bound of this process (set once at start-up from the settings)."""
    _bound[0] = seconds


def bound() -> float:
    return _bound[0]


class request_budget:
    """Give the current task (an HTTP request's) one budget for all its waits. A class, not a
    generator's context manager: every request enters it, and with `spending` that cost 4.3 µs
    a request against 2.4 (timeit; py-spy had put them at 4% of the server's CPU under bench
    (2))."""

    __slots__ = ("_budget", "_token")

    def __init__(
        self, seconds: float | None = None, body_to_come: bool = False, streamed: bool = False
    ) -> None:
        self._budget = Budget(_bound[0] if seconds is None else seconds, body_to_come, streamed)

    def __enter__(self) -> Budget:
        self._token = _budget.set(self._budget)
        return self._budget

    def __exit__(self, *_: object) -> None:
        _budget.reset(self._token)
        self._budget.tenant = None
        if self._budget.reserved is not None:
            _unreserve(self._budget)
        if self._budget.turn is not None:
            _give_back(self._budget)


async def within_allowance(awaitable: Awaitable[T], what: str) -> T:
    """`awaitable`, waited for within the current allowance and spent from the request's budget;
    past it, Unanswered (`what` did not answer). A TimeoutError of its own passes as it is."""
    with spending() as allowed:
        bound = asyncio.timeout(allowed)
        try:
            async with bound:
                return await awaitable
        except TimeoutError:
            if not bound.expired():
                raise
            raise Unanswered(what, allowed) from None


def renew_budget() -> None:
    """The running request begins a new attempt after waiting for a live event (a write
    blocked for credit, woken): its waits on backing services are bounded afresh."""
    budget = _own_budget()
    if budget is not None:
        budget.left = _bound[0]


def _own_budget() -> Budget | None:
    budget = _budget.get()
    if budget is not None and budget.task is asyncio.current_task():
        return budget
    return None


def allowance() -> float:
    """How long the current task may wait on its next operation."""
    return _allowance(_own_budget())


def _allowance(budget: Budget | None) -> float:
    return _bound[0] if budget is None else min(_bound[0], max(budget.left, 0.0))


class spending:
    """Around a wait the caller bounds itself (with the allowance it gives): what it took is
    spent from the request's budget. A class, as `request_budget` is: every append enters it."""

    __slots__ = ("_budget", "_started")

    def __enter__(self) -> float:
        budget = self._budget = _own_budget()
        self._started = time.monotonic()
        return _allowance(budget)

    def __exit__(self, *_: object) -> None:
        if self._budget is not None:
            self._budget.left -= time.monotonic() - self._started


def committing() -> None:
    """Called by a write right before it sends COMMIT: from here on, a failure's outcome is
    unknown."""
    commit = _commit.get()
    if commit is not None:
        commit.sent = True


def commit_refused() -> None:
    """The server answered the COMMIT sent with an error: nothing was committed, and a failure
    from here on (a transaction run again) is known again."""
    commit = _commit.get()
    if commit is not None:
        commit.sent = False


def watching_commit(context: contextvars.Context) -> CommitWatch:
    """In `context` (a task's about to run a write), note whether COMMIT gets sent."""
    commit = CommitWatch()
    context.run(_commit.set, commit)
    context.run(_budget.set, None)  # the task is not the request: it has no budget of its own
    return commit


# The tenant each task acts for; weak, so a finished task is forgotten with it.
_acting: weakref.WeakKeyDictionary[asyncio.Task[Any], str] = weakref.WeakKeyDictionary()


def act_for(tenant: str) -> None:
    """The running task (a request's, once authenticated) acts for `tenant`."""
    task = asyncio.current_task()
    if task is not None:
        _acting[task] = tenant


async def at_work_for(tenant: str) -> None:
    """The running request acts for `tenant` and takes one of its turns at work, as an
    authenticated request does (its body to come: once the body is in). For a request whose
    token names a tenant and no principal: a webhook's callback, a pull-wake worker's ack or
    release, by their wake tokens."""
    act_for(tenant)
    await take_turn(tenant)


def acts_like(task: asyncio.Task[Any]) -> None:
    """`task`, started by the running task to do its own work, acts for the same tenant."""
    current = asyncio.current_task()
    tenant = None if current is None else _acting.get(current)
    if tenant is not None:
        _acting[task] = tenant


def acting_for() -> str | None:
    """The tenant the running task acts for, if it is a request's (or one of its own)."""
    task = asyncio.current_task()
    return None if task is None else _acting.get(task)


def stop_acting() -> None:
    """The running task's next request (a server may serve a connection's requests on one
    task) acts for no tenant until it authenticates."""
    task = asyncio.current_task()
    if task is not None:
        _acting.pop(task, None)


# Turns at work. A request, once it knows its tenant (`take_turn`: at its first step when the
# process knows its token, else when it authenticates; a request whose head announces a body,
# once the body is in: `body_arrived`), is at work on one of its tenant's turns until it ends,
# its answer starts, or it starts to wait for a live event or for credit (`give_turn`: a
# long-poll, a subscription, a write blocked for credit); a long-poll takes one again to answer
# (`back_to_work`). Past `turns_per_tenant` of them, the tenant's next request waits for one of
# its own to give its turn back, in arrival order, within its budget; then 429. The event loop
# runs every request's steps in turn: without this, 9,900 long-polls of one tenant answered
# together came back as 9,900 requests at work at once, and every step of another tenant's
# request waited behind a step of each (seconds). Waiting here costs nothing per turn of the
# loop. At most `waiting_per_tenant` of a tenant's arriving requests wait so; one more is 429 at
# once. A client that sends requests and closes its connections without waiting for their
# answers is bound by no concurrency of its own: 13,000 a second queued 117,000 of them for
# turns within 15 s, each waiting out its budget for an answer nobody would read, and another
# tenant's appends took seconds. A request that waited for a live event and goes back to work
# is not refused so (its tenant's live connections are capped already, and its wait is done).


class TooManyAtWork(Backpressure):
    """The tenant's requests at work in this process were at the limit for as long as this one
    could wait: 429 with Retry-After, the tenant's own load, not an outage."""

    code = "too-many-requests"


class AnswersNotTaken(TooManyAtWork):
    """The tenant's answers that their clients have not taken yet hold, in this process, as many
    bytes as it may (`configure_turns(answer_bytes_per_tenant=)`): 429 before any work is done
    for its next request."""


class _Turns:
    __slots__ = ("at_work", "coming", "queued", "tenant", "waiting")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.at_work = 0
        self.queued = 0  # arriving requests waiting for a turn (`waiting` keeps cancelled ones)
        self.coming = 0  # requests admitted whose body is still to come (`_reserve`)
        # Each waiting request's future, and whether it counts in `queued` (an arriving one).
        self.waiting: collections.deque[tuple[asyncio.Future[None], bool]] = collections.deque()


_turns: dict[str, _Turns] = {}
_turns_per_tenant = [0]  # 0: no limit
_waiting_per_tenant = [0]  # 0: no limit
_answer_bytes_per_tenant = [0]  # 0: no limit
_answer_bytes: dict[str, int] = {}  # per tenant, of the large answers being written now
_answer_bytes_per_process = [0]  # 0: no limit
_answer_bytes_total = [0]  # of all tenants' (the sum of `_answer_bytes`)
answers_refused = [0]  # requests refused so (/metrics)
turn_waits = [0]  # requests that waited for a turn (/metrics)
turn_queue_full = [0]  # arriving requests refused at once, their tenant's queue full (/metrics)


def configure_turns(
    per_tenant: int,
    waiting_per_tenant: int = 0,
    answer_bytes_per_tenant: int = 0,
    answer_bytes_per_process: int = 0,
) -> None:
    """Each tenant's requests at work at once in this process (0: no limit), its arriving
    requests that may wait for one of those turns (0: no limit), the bytes of its answers
    being written past which its next requests are refused (0: no limit), and the bytes of all
    tenants' past which a tenant holding at least its equal share of them is refused."""
    _turns_per_tenant[0] = per_tenant
    _waiting_per_tenant[0] = waiting_per_tenant
    _answer_bytes_per_tenant[0] = answer_bytes_per_tenant
    _answer_bytes_per_process[0] = answer_bytes_per_process


def _answers_capped() -> bool:
    return bool(_answer_bytes_per_tenant[0] or _answer_bytes_per_process[0])


def answer_writing(size: int) -> tuple[str, int] | None:
    """The running request's answer of `size` bytes is being written: charged to its tenant
    until `answer_written` (a client that does not read holds it meanwhile). AnswersNotTaken
    if its tenant's answers are at their cap already: requests at work when the cap was
    reached were let in before it, and their answers are not written past it either."""
    budget = _budget.get()
    tenant = None if budget is None else budget.tenant
    if tenant is None:
        return None
    _answers_taken(tenant)
    _answer_bytes[tenant] = _answer_bytes.get(tenant, 0) + size
    _answer_bytes_total[0] += size
    return tenant, size


def answer_written(charged: tuple[str, int] | None) -> None:
    if charged is not None:
        tenant, size = charged
        _answer_bytes_total[0] -= size
        left = _answer_bytes[tenant] - size
        if left:
            _answer_bytes[tenant] = left
        else:
            del _answer_bytes[tenant]


async def take_turn(tenant: str) -> None:
    """The running request goes to work on one of `tenant`'s turns (at once while it has one
    free; else in arrival order once one of its own gives its turn back, or 429 `TooManyAtWork`
    when the request's budget runs out first). Not a request's task (no budget of its own),
    or one already at work: nothing to do."""
    budget = _own_budget()
    if _turns_per_tenant[0] and budget is not None and budget.turn is None:
        budget.tenant = tenant
        if not budget.body_to_come:
            await _take(budget, tenant, arriving=True)
        else:
            # Its turn comes once its body is in; but were it in now, it would be refused at
            # once: so it is refused now, before its body is read (and before the framework's
            # routing, at the edge's gate, for a token the process knows).
            if not budget.admitted:  # (admitted already at the edge's gate: not again)
                _arrival_refused(tenant)
                budget.admitted = True
                _reserve(budget, tenant)
    elif budget is not None and budget.tenant is None and _answers_capped():
        # No turns to take, but its answers are still charged to its tenant, and refused past
        # the tenant's bytes of answers not yet taken (`answer_writing`).
        budget.tenant = tenant
        if not budget.body_to_come:
            _answers_taken(tenant)


async def body_arrived() -> None:
    """The running request's body is in: it goes to work on its tenant's turn (taken when it
    authenticated, had its body been in; a body's sender is not at work, and a slow one would
    otherwise hold its tenant's turns for as long as it drips)."""
    budget = _own_budget()
    if budget is not None and budget.body_to_come:
        budget.body_to_come = False
        if budget.reserved is not None:
            _unreserve(budget)  # (and counted again at once, if it has to wait: `_take`)
        # (Not for a body drained after the answer: its request is done acting for anyone.)
        if _turns_per_tenant[0] and budget.turn is None and budget.tenant and acting_for():
            await _take(budget, budget.tenant, arriving=True)
        elif not _turns_per_tenant[0] and budget.tenant and acting_for():
            _answers_taken(budget.tenant)


async def back_to_work() -> None:
    """The running request, its wait for a live event over, takes its tenant's turn at work
    again to answer (in arrival order, as `take_turn`): 9,900 long-polls woken together would
    otherwise all be at work at once. Also from a task the request started to do its own work."""
    budget = _budget.get()
    if _turns_per_tenant[0] and budget is not None and budget.turn is None and budget.tenant:
        await _take(budget, budget.tenant)


def _answers_taken(tenant: str) -> None:
    """AnswersNotTaken if `tenant`'s answers being written hold as many bytes as they may: the
    tenant's own cap, or, once all tenants' together reach the process's, at least its equal
    share of those (a tenant holding less is served: eight tenants at their caps once held
    3.25 GB together, and a ninth is not refused for them)."""
    held = _answer_bytes.get(tenant, 0)
    most = _answer_bytes_per_tenant[0]
    if most and held >= most:
        answers_refused[0] += 1
        raise AnswersNotTaken(
            f"this tenant's answers not yet taken by their clients hold {most} bytes on this "
            "server; read them, or retry shortly",
        )
    total, process = _answer_bytes_total[0], _answer_bytes_per_process[0]
    if process and total >= process and held and held * len(_answer_bytes) >= total:
        answers_refused[0] += 1
        raise AnswersNotTaken(
            f"the answers not yet taken by their clients hold {process} bytes on this server, "
            "this tenant's at least its share of them; read them, or retry shortly",
        )


def _arrival_refused(tenant: str) -> None:
    """TooManyAtWork if an arriving request of `tenant` would be refused at once: its answers
    not yet taken at their cap, or its requests waiting for a turn at theirs (those whose body
    is still to come counted as waiting, past the turns free)."""
    _answers_taken(tenant)
    turns = _turns.get(tenant)
    if turns is not None and turns.at_work + turns.coming >= _turns_per_tenant[0]:
        _queue_room(turns)


def _reserve(budget: Budget, tenant: str) -> None:
    """A request admitted with its body to come will go to work (or wait for a turn) once its
    body is in: it counts in its tenant's turns from now (`coming`) until then, or until it
    ends. Counted only once its body was in, as before, it was not counted while the framework
    routed it: every request of the tenant arriving meanwhile was admitted, since the turns and
    the queue looked as they did. Under a flood of one tenant's wake acks, a turn of the event
    loop grew to seconds, each admitting thousands more, routed and then refused; another
    tenant's appends waited up to 9 s. An upload (`streamed`) takes no turn: not counted."""
    if budget.streamed or budget.reserved is not None:
        return
    turns = _turns.get(tenant)
    if turns is None:
        turns = _turns[tenant] = _Turns(tenant)
    turns.coming += 1
    budget.reserved = turns


def _unreserve(budget: Budget) -> None:
    turns = budget.reserved
    assert turns is not None
    budget.reserved = None
    turns.coming -= 1
    _forget_idle(turns)


def _forget_idle(turns: _Turns) -> None:
    if not turns.at_work and not turns.coming and _turns.get(turns.tenant) is turns:
        del _turns[turns.tenant]


def _queue_room(turns: _Turns) -> None:
    waiting = turns.queued + max(0, turns.at_work + turns.coming - _turns_per_tenant[0])
    if (most := _waiting_per_tenant[0]) and waiting >= most:
        turn_queue_full[0] += 1
        raise TooManyAtWork(
            f"this tenant already has {_turns_per_tenant[0]} requests at work on this server "
            f"and {most} waiting; retry shortly",
        )


async def _take(budget: Budget, tenant: str, arriving: bool = False) -> None:
    if arriving:
        _answers_taken(tenant)
    limit = _turns_per_tenant[0]
    turns = _turns.get(tenant)
    if turns is None:
        turns = _turns[tenant] = _Turns(tenant)
    if turns.at_work < limit:  # (while any wait, every turn is at work: handed over)
        turns.at_work += 1
        budget.turn = turns
        return
    if arriving and not budget.admitted:
        # (One admitted with its body to come had its place in the queue counted as it was
        # admitted, `_reserve`: refused now, after its body was read, for the requests admitted
        # after it, it would go before them out of the queue it was let into.)
        _queue_room(turns)
    turn_waits[0] += 1
    handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    turns.waiting.append((handed, arriving))
    turns.queued += arriving
    with spending() as allowed:
        try:
            async with asyncio.timeout(allowed):
                await asyncio.shield(handed)
        except BaseException as error:
            if handed.done() and not handed.cancelled():
                budget.turn = turns  # handed over as it gave up: handed on
                _give_back(budget)
            else:
                handed.cancel()  # skipped by whoever gives a turn back
            if isinstance(error, TimeoutError):
                raise TooManyAtWork(
                    f"this tenant already has {limit} requests at work on this server, and more "
                    "waiting; retry shortly",
                ) from None
            raise
        finally:
            if handed.cancelled():  # (one handed its turn was counted out as it was handed)
                turns.queued -= arriving
    budget.turn = turns  # the turn given back was handed over: counted at work already
    if budget.tenant is None:  # the request ended meanwhile (a task of its own waited)
        _give_back(budget)
    elif arriving:
        try:  # (its tenant's answers may have filled up while it waited)
            _answers_taken(tenant)
        except AnswersNotTaken:
            _give_back(budget)
            raise


def give_turn() -> None:
    """The running request stops being at work (it waits for a live event now): its turn goes
    to its tenant's next request waiting, if any. Also from a task the request started to do
    its own work (its wait raced against its client leaving), which shares its budget."""
    budget = _budget.get()
    if budget is not None and budget.turn is not None:
        _give_back(budget)


def _give_back(budget: Budget) -> None:
    turns = budget.turn
    assert turns is not None
    budget.turn = None
    while turns.waiting:
        handed, arriving = turns.waiting.popleft()
        if not handed.done():
            handed.set_result(None)
            turns.queued -= arriving  # it waits no more, though its task has yet to run
            return
    turns.at_work -= 1
    _forget_idle(turns)
