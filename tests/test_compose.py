"""``compose.yaml``'s demo is whole: every call example.yaml makes reaches a service it runs.

No image can be built here (docs/deployment.md), so the file is read: which configuration
each routemaster container loads, where that configuration sends, what is published.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from routemaster.config import load_config
from routemaster.config.model import Action, Config

REPOSITORY = Path(__file__).resolve().parents[1]


def _compose() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((REPOSITORY / "compose.yaml").read_text())["services"]
    return services


def _configuration(service: dict[str, Any]) -> Config:
    """What a routemaster container loads: its entrypoint's ``-c`` files, as mounted."""
    mounted = {
        inside: REPOSITORY / outside
        for outside, inside, *_ in (volume.split(":") for volume in service["volumes"])
    }
    words = service["entrypoint"]
    files = [mounted[words[i + 1]] for i, word in enumerate(words) if word == "-c"]
    return load_config(files)


def _listening(services: dict[str, Any]) -> set[tuple[str, int]]:
    """(host name, port) of every service started with ``--bind 0.0.0.0:PORT``."""
    found = set()
    for name, service in services.items():
        words = [*service.get("entrypoint", []), *service.get("command", [])]
        for i, word in enumerate(words[:-1]):
            if word == "--bind" and words[i + 1].startswith("0.0.0.0:"):
                found.add((name, int(words[i + 1].rpartition(":")[2])))
    return found


def test_every_call_the_demo_makes_reaches_a_service_compose_runs() -> None:
    services = _compose()
    listening = _listening(services)
    for name in ("migrate", "web", "worker"):
        config = _configuration(services[name])
        (order,) = config.state_machines
        urls = [feed.url for feed in order.feeds] + [
            state.webhook
            for state in order.states
            if isinstance(state, Action) and state.webhook is not None
        ]
        assert len(urls) == 3  # the stock feed, ship, notify_customer
        for url in urls:
            parts = urlsplit(url.replace("<label>", "order-1"))
            assert (parts.hostname, parts.port) in listening, (name, url, listening)
            # with the headers example.yaml gives its receiver
            assert any(re.search(rule.match, url) for rule in order.webhooks), url


def test_the_api_without_access_control_is_published_on_this_machine_only() -> None:
    services = _compose()
    config = _configuration(services["web"])
    assert not config.api.tokens_required
    for port in services["web"]["ports"]:
        assert port.startswith("127.0.0.1:"), port
