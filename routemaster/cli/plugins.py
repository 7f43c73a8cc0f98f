"""What the worker does to the 1.x plugins it loads: their StatsD lines leave at once.

``routemaster-statsd`` sends through statsd-python's UDP client, which keeps
lines until a packet's worth (1,432 bytes) has gathered. In the API, requests
fill packets quickly; in 1.x the worker shared the API's client. A worker
process of its own sends a few lines a minute, which would sit in its
buffer for hours (and be lost when it stops). So in the worker each
plugin's client sends every line as it comes (statsd-python's documented
``max_buffer_size = 0``): one small datagram per webhook or job.
"""

from __future__ import annotations

from collections.abc import Iterable

from routemaster.logging import BaseLogger


def sending_statsd_at_once(plugins: Iterable[BaseLogger]) -> None:
    try:
        from statsd import UDPStatsdClient
    except ImportError:  # no plugin can be using it
        return
    for plugin in plugins:
        for value in getattr(plugin, "__dict__", {}).values():
            if isinstance(value, UDPStatsdClient):
                value.max_buffer_size = 0
