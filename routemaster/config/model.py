"""The compiled, immutable configuration: what every other package reads.

Built by :mod:`routemaster.config.loader` from YAML after schema and semantic
validation, so code holding a :class:`Config` may rely on it being coherent
(every destination exists, every condition compiled, feed names unique).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from routemaster.config.receiver_rules import ReceiverPolicy
from routemaster.exit_conditions import Program

Path = tuple[str, ...]
"""A dotted context path split on dots: ``("metadata", "user", "tz")``."""


@dataclass(frozen=True)
class MetadataTrigger:
    """Evaluate the gate when an update touches ``path`` (below ``metadata``)."""

    path: Path  # without the leading "metadata", e.g. ("payment", "status")


@dataclass(frozen=True)
class IntervalTrigger:
    """Evaluate every label in the gate every ``interval``."""

    interval: datetime.timedelta


@dataclass(frozen=True)
class SystemTimezone:
    """The worker host's local time zone (the reference's behaviour)."""


@dataclass(frozen=True)
class NamedTimezone:
    name: str  # a valid IANA name, checked at load


@dataclass(frozen=True)
class MetadataTimezone:
    """Each label's own zone, read from its metadata; invalid or missing: skipped."""

    path: Path  # full context path, starting with "metadata"


Timezone = SystemTimezone | NamedTimezone | MetadataTimezone


@dataclass(frozen=True)
class TimeTrigger:
    """Evaluate every label in the gate daily at ``time`` in ``timezone``."""

    time: datetime.time
    timezone: Timezone = field(default_factory=SystemTimezone)


@dataclass(frozen=True)
class EntryTrigger:
    """Evaluate as a label enters the gate (``event: entry``)."""


@dataclass(frozen=True)
class TimerTrigger:
    """Evaluate each label at its next check itself, to the second (``event: timer``).

    No occurrences: the moment comes from the exit condition and the label's
    metadata (SPEC E1), so a waiting label costs nothing until then.
    """


Trigger = MetadataTrigger | IntervalTrigger | TimeTrigger | EntryTrigger | TimerTrigger
ClockTrigger = IntervalTrigger | TimeTrigger | TimerTrigger
"""The triggers that evaluate a waiting label at a moment, not on an event."""


@dataclass(frozen=True)
class ConstantNext:
    state: str


@dataclass(frozen=True)
class ContextNextDestination:
    value: Any  # compared with ``==`` against the looked-up value
    state: str


@dataclass(frozen=True)
class ContextNext:
    path: Path  # full context path, e.g. ("metadata", "variant")
    default: str
    destinations: tuple[ContextNextDestination, ...]


@dataclass(frozen=True)
class NoNext:
    """An end state: no transition out."""


NextStates = ConstantNext | ContextNext | NoNext


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing action is retried before the label is marked errored."""

    max_attempts: int = 10
    initial_delay: datetime.timedelta = datetime.timedelta(seconds=1)
    max_delay: datetime.timedelta = datetime.timedelta(minutes=10)
    multiplier: float = 2.0
    timeout: datetime.timedelta = datetime.timedelta(seconds=10)  # per request


OUTCOMES = ("succeeded", "failed")
"""What a child label comes to when it enters a state marked ``outcome:`` (SPEC G3)."""


@dataclass(frozen=True)
class Gate:
    name: str
    exit_condition: Program
    triggers: tuple[Trigger, ...]
    next_states: NextStates
    outcome: str | None = None  # "succeeded" or "failed": a child entering it has finished


@dataclass(frozen=True)
class PercentileLease:
    """``lease: {percentile: P, min: D, max: D}``: a lease set at each claim from past work.

    The P-th percentile (nearest rank) of the claim-to-completion durations of
    the action's last 100 completed tasks, clamped to [min, max]; ``min`` while
    fewer than 20 have completed (SPEC E4, dfsmr's timeout strategies).
    """

    percentile: float  # in (0, 100]
    min: datetime.timedelta
    max: datetime.timedelta


@dataclass(frozen=True)
class PullWorker:
    """``worker: {lease: ...}``: the label waits for a worker process to claim it (SPEC D1)."""

    # How long a claim holds the label without a heartbeat: fixed, or derived at each claim.
    lease: datetime.timedelta | PercentileLease
    # A lease that runs out errors the label at once instead of offering the work again.
    at_most_once: bool = False

    @property
    def longest_lease(self) -> datetime.timedelta:
        """The longest lease a claim may set (the fixed one, or the percentile's ``max``)."""
        return self.lease.max if isinstance(self.lease, PercentileLease) else self.lease


@dataclass(frozen=True)
class Flow:
    """``flow:`` of an action (SPEC G2): labels queue per key, served in turn by weight,
    at most ``concurrency`` of one key holding a slot at once (None: no cap)."""

    name: str  # actions naming the same flow share its per-key counts; default SM.STATE
    key: tuple[str, ...]  # metadata path (without "metadata"); missing: the null key
    concurrency: int | None = None
    weight: tuple[str, ...] | None = None  # metadata path to a number >= 1 (default 1)


@dataclass(frozen=True)
class Action:
    name: str
    webhook: str | None  # may contain <label> and <state_machine>; None for a pull action
    next_states: NextStates
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    worker: PullWorker | None = None  # set instead of ``webhook``: claimed through /tasks
    # with a webhook: a 202 answer makes the delivery a task the receiver completes later
    async_timeout: datetime.timedelta | None = None
    flow: Flow | None = None  # per-key concurrency and fair claiming (SPEC G2)
    outcome: str | None = None  # "succeeded" or "failed": a child entering it has finished

    @property
    def pulled(self) -> bool:
        """Whether worker processes claim this action (no webhook is ever sent)."""
        return self.worker is not None


@dataclass(frozen=True)
class Spawn:
    """``spawn:``: one child label of ``machine`` per element of a list, then wait for them.

    The label waits here until ``at_least`` children have succeeded (``None``:
    ``wait: all``; 1: ``wait: any``) or every child has finished, then leaves by
    ``next``, whose path may read ``children.*`` (SPEC G3).
    """

    name: str
    machine: str  # the child machine
    for_each: Path  # full context path, starting with "metadata"
    next_states: NextStates
    at_least: int | None = None
    on_exit_delete: bool = False  # ``on_exit: delete``: children still running are deleted
    outcome: str | None = None

    def met(self, succeeded: int, running: int) -> bool:
        """Whether the parent stops waiting with these counts."""
        return running == 0 or (self.at_least is not None and succeeded >= self.at_least)


State = Gate | Action | Spawn


@dataclass(frozen=True)
class Feed:
    name: str
    url: str  # may contain <label> and <state_machine>


@dataclass(frozen=True)
class WebhookHeaderRule:
    """Extra headers for webhook (and feed) URLs matching ``match`` (``re.search``)."""

    match: str
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Migration:
    """What happens to labels found in a state the machine no longer has (``migrations:``).

    ``rename``: the label keeps its entry (entered time, attempts, due time,
    idempotency token) under the new name. ``move``: it enters ``to_state``
    as a forced move does.
    """

    kind: str  # "rename" or "move"
    from_state: str  # not a state of the machine
    to_state: str  # a state of the machine

    @property
    def reason(self) -> str:
        """The reason recorded in each migrated label's history."""
        return f"migration: {self.kind} {self.from_state} -> {self.to_state}"


@dataclass(frozen=True)
class Retention:
    """How long rows stay (``retention:``); ``None``: kept for ever, as in 1.x.

    ``history``: history entries older than this are pruned, but never the
    entry that put a label in its current state. ``deleted``: a deleted label
    and its whole history are removed this long after its deletion (its name
    is then free). ``finished``: a label this long in an end state (no
    ``next``) is deleted, then removed after ``deleted`` like any other.
    """

    history: datetime.timedelta | None = None
    deleted: datetime.timedelta | None = None
    finished: datetime.timedelta | None = None


@dataclass(frozen=True)
class StateMachine:
    name: str
    states: tuple[State, ...]  # the first is where new labels start
    feeds: tuple[Feed, ...] = ()
    webhooks: tuple[WebhookHeaderRule, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    signing_secret: str | None = None  # HMAC-SHA256 webhook signing when set
    # metadata paths (without "metadata") that searches compare often: each gets an index
    search: tuple[tuple[str, ...], ...] = ()
    migrations: tuple[Migration, ...] = ()
    # the top level's ``retention`` with this machine's keys over it
    retention: Retention = field(default_factory=Retention)
    # what a new version does to labels created under an older one (SPEC E4): "upgrade"
    # (they follow the definition in force), "continue" (they finish under their own),
    # "abort" (they are moved, forced, to ``abort_to``)
    upgrade_strategy: str = "upgrade"
    abort_to: str | None = None

    @property
    def continues(self) -> bool:
        """Whether each label finishes under the version it was created under."""
        return self.upgrade_strategy == "continue"

    @property
    def keeps_versions(self) -> bool:
        """Whether labels record the version they were created under (continue, abort)."""
        return self.upgrade_strategy != "upgrade"

    def get_state(self, name: str) -> State:
        """The state called ``name``; ``KeyError`` when the machine has none."""
        for state in self.states:
            if state.name == name:
                return state
        raise KeyError(name)

    @property
    def initial_state(self) -> State:
        return self.states[0]

    def feed(self, name: str) -> Feed:
        for feed in self.feeds:
            if feed.name == name:
                return feed
        raise KeyError(name)


@dataclass(frozen=True)
class LoggingPlugin:
    dotted_path: str  # "package.module:Class"
    kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class ApiConfig:
    """How the HTTP API is exposed (the ``api:`` section)."""

    # "none": open, as in 1.x; "tokens": every request but GET / and /metrics needs a
    # bearer token with the endpoint's scope (routemaster token create).
    authentication: str = "none"

    @property
    def tokens_required(self) -> bool:
        return self.authentication == "tokens"


@dataclass(frozen=True)
class SubscriptionsConfig:
    """Where push subscriptions may send (the ``subscriptions:`` section)."""

    # regular expressions searched in a URL's origin (scheme://host[:port]): an origin
    # that one matches may resolve inside the network (loopback, private, link-local)
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class Config:
    state_machines: tuple[StateMachine, ...]
    logging_plugins: tuple[LoggingPlugin, ...] = ()
    api: ApiConfig = field(default_factory=ApiConfig)
    subscriptions: SubscriptionsConfig = field(default_factory=SubscriptionsConfig)
    sources: tuple[str, ...] = ()  # the files it was loaded from, for messages
    receivers: tuple[ReceiverPolicy, ...] = ()  # the ``receivers:`` rules, first match wins
    retention: Retention = field(default_factory=Retention)  # the top level's ``retention``

    @cached_property
    def child_machines(self) -> frozenset[str]:
        """The machines some spawn state creates children in: derived once, since every write
        of a label asks whether it may be a child."""
        return frozenset(
            state.machine
            for machine in self.state_machines
            for state in machine.states
            if isinstance(state, Spawn)
        )

    def get_machine(self, name: str) -> StateMachine:
        """The machine called ``name``; ``KeyError`` when there is none."""
        for machine in self.state_machines:
            if machine.name == name:
                return machine
        raise KeyError(name)
