"""A machine's graph laid out for an SVG picture: states in layers, edges between them.

Layers follow the shortest path from the first state, so a machine reads
top to bottom in the order labels go through it; edges that go back up (or
to the same layer) are drawn round the right-hand side. Pure layout: the
console's template draws it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

NODE_WIDTH = 200
NODE_GAP = 40
LAYER_GAP = 70
LINE = 15  # pixels per line of text in a node
MARGIN = 20


@dataclass(frozen=True)
class Node:
    name: str
    kind: str  # "gate" or "action"
    lines: tuple[str, ...]  # what the state does: its triggers, its webhook
    end: bool
    x: float
    y: float
    width: float
    height: float

    @property
    def centre(self) -> float:
        return self.x + self.width / 2


@dataclass(frozen=True)
class Edge:
    path: str  # SVG path data
    label: str
    label_x: float
    label_y: float


@dataclass(frozen=True)
class Layout:
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    width: float
    height: float


def layout(described: dict[str, Any]) -> Layout:
    """Positions for ``describe_machine``'s states and edges."""
    states = described["states"]
    layers = _layers([state["name"] for state in states], described["edges"])
    rows: dict[int, list[dict[str, Any]]] = {}
    for state in states:
        rows.setdefault(layers[state["name"]], []).append(state)
    widest = max(len(row) for row in rows.values())
    width = MARGIN * 2 + widest * NODE_WIDTH + (widest - 1) * NODE_GAP + 80  # room for loops
    nodes: dict[str, Node] = {}
    y = float(MARGIN)
    for layer in sorted(rows):
        row = rows[layer]
        span = len(row) * NODE_WIDTH + (len(row) - 1) * NODE_GAP
        x = (width - 80 - span) / 2
        heights = []
        for state in row:
            lines = _lines(state)
            height = 2 * LINE + 18 + LINE * len(lines)
            heights.append(height)
            nodes[state["name"]] = Node(
                state["name"], state["kind"], lines, state["end"], x, y, NODE_WIDTH, height
            )
            x += NODE_WIDTH + NODE_GAP
        y += max(heights) + LAYER_GAP
    edges = tuple(
        _edge(nodes[edge["from"]], nodes[edge["to"]], edge, layers, width)
        for edge in described["edges"]
        if edge["from"] in nodes and edge["to"] in nodes
    )
    return Layout(tuple(nodes.values()), edges, width, y - LAYER_GAP + MARGIN)


def _layers(names: list[str], edges: list[dict[str, Any]]) -> dict[str, int]:
    following: dict[str, list[str]] = {name: [] for name in names}
    for edge in edges:
        following.setdefault(edge["from"], []).append(edge["to"])
    layers = {names[0]: 0}
    queue = deque([names[0]])
    while queue:
        name = queue.popleft()
        for nxt in following.get(name, []):
            if nxt not in layers:
                layers[nxt] = layers[name] + 1
                queue.append(nxt)
    deepest = max(layers.values())
    for name in names:  # unreachable states (the config forbids them) go last
        layers.setdefault(name, deepest + 1)
    return layers


def _lines(state: dict[str, Any]) -> tuple[str, ...]:
    lines = [trigger_text(trigger) for trigger in state["triggers"]]
    if state["webhook"]:
        lines.append("webhook " + _shorten(state["webhook"]))
    worker = state.get("worker")
    if worker:
        lines.append(_worker_line(worker))
    if state["end"]:
        lines.append("end state")
    return tuple(lines)


def _worker_line(worker: dict[str, Any]) -> str:
    """A pull action's lease in a few words: fixed, or a percentile between its bounds."""
    if "lease" in worker:
        lease = f"lease {worker['lease']}s"
    else:
        lease = f"lease p{worker['percentile']:g} {worker['min']}-{worker['max']}s"
    return f"pull workers, {lease}" + (", at most once" if worker["at_most_once"] else "")


def trigger_text(trigger: dict[str, Any]) -> str:
    """A trigger of ``describe_machine`` in a few words."""
    kind = trigger["kind"]
    if kind == "metadata":
        return f"on metadata.{_shorten(trigger['path'], 18)}"
    if kind == "interval":
        return f"every {_duration(trigger['seconds'])}"
    if kind == "time":
        return f"daily at {trigger['time'][:5]} ({_shorten(trigger['timezone'], 14)})"
    if trigger.get("event") == "timer":
        return "at its next check"
    return "on entry"


def _duration(seconds: float) -> str:
    total, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size:
            parts.append(f"{total // size}{unit}")
            total %= size
    return "".join(parts) or "0s"


def _shorten(text: str, limit: int = 22) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _edge(
    source: Node, target: Node, edge: dict[str, Any], layers: dict[str, int], width: float
) -> Edge:
    label = ""
    if edge["kind"] == "context":
        label = f"= {edge['value']!s}"
    elif edge["kind"] == "default":
        label = "otherwise"
    if layers[target.name] > layers[source.name]:
        x1, y1 = source.centre, source.y + source.height
        x2, y2 = target.centre, target.y
        bend = (y2 - y1) / 2
        path = (
            f"M{x1:.0f},{y1:.0f} C{x1:.0f},{y1 + bend:.0f} "
            f"{x2:.0f},{y2 - bend:.0f} {x2:.0f},{y2:.0f}"
        )
        return Edge(path, label, (x1 + x2) / 2 + 6, (y1 + y2) / 2)
    # back to an earlier layer (or a loop): round the right-hand side
    x1, y1 = source.x + source.width, source.y + source.height / 2
    x2, y2 = target.x + target.width, target.y + target.height / 2 + 8
    out = min(width - 10, max(x1, x2) + 60)
    path = f"M{x1:.0f},{y1:.0f} C{out:.0f},{y1:.0f} {out:.0f},{y2:.0f} {x2:.0f},{y2:.0f}"
    return Edge(path, label, out - 20, (y1 + y2) / 2)
