"""Which receiver each configured URL reaches: the map the worker and the API share (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from routemaster.config.model import Action, Config
from routemaster.config.receiver_rules import ReceiverPolicy, origin_of, policy_for, receiver_id


@dataclass(frozen=True)
class Receiver:
    id: str
    origin: str
    policy: ReceiverPolicy
    action_states: tuple[tuple[str, str], ...]  # (machine, action) whose webhooks go there


def configured_receivers(config: Config) -> dict[str, Receiver]:
    """Every origin of the configuration's webhooks and feeds, by receiver id."""
    states: dict[str, list[tuple[str, str]]] = {}
    origins: dict[str, str] = {}
    for machine in config.state_machines:
        for feed in machine.feeds:
            origin = origin_of(feed.url)
            origins[receiver_id(origin)] = origin
        for state in machine.states:
            # A pull action (``worker:``) has no webhook: workers claim it through /tasks, so
            # it is no receiver's and the receivers' claims never select its labels.
            if isinstance(state, Action) and state.webhook is not None:
                origin = origin_of(state.webhook)
                ident = receiver_id(origin)
                origins[ident] = origin
                states.setdefault(ident, []).append((machine.name, state.name))
    return {
        ident: Receiver(
            ident, origin, policy_for(config.receivers, origin), tuple(states.get(ident, ()))
        )
        for ident, origin in origins.items()
    }


def receiver_for_url(config: Config, url: str) -> Receiver:
    """The receiver of a URL that may not be in the configuration (a subscription's)."""
    origin = origin_of(url)
    return Receiver(receiver_id(origin), origin, policy_for(config.receivers, origin), ())
