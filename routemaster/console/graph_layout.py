"""A machine's graph laid out for an SVG picture: states in layers, edges between them.

Layers follow the shortest path from the first state, so a machine reads
top to bottom in the order labels go through it; edges that go back up (or
to the same layer) are drawn round the right-hand side. Edges joining the same
two states (a context rule's value and its default) fan out as separate
curves, and each edge's label is moved along until it overlaps neither
another label nor a state. Pure layout: the console's template draws it.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, replace
from typing import Any

NODE_WIDTH = 200  # at least; wider for long names and triggers, up to NODE_MAX
NODE_MAX = 320
NAME_CHAR = 9  # pixels per character of a state's name, at most (14px bold)
NODE_GAP = 40
LAYER_GAP = 70
LINE = 15  # pixels per line of text in a node
MARGIN = 20
LABEL_CHAR = 7  # pixels per character of an edge's label, at most (12px text)
FAN = 36  # pixels between the curves of edges joining the same two states


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
    sized = {state["name"]: _sized(state) for state in states}
    spans = {
        layer: sum(sized[state["name"]][1] for state in row) + (len(row) - 1) * NODE_GAP
        for layer, row in rows.items()
    }
    width = MARGIN * 2 + max(spans.values()) + 80  # room for loops
    nodes: dict[str, Node] = {}
    y = float(MARGIN)
    for layer in sorted(rows):
        row = rows[layer]
        x = (width - 80 - spans[layer]) / 2
        heights = []
        for state in row:
            lines, node_width = sized[state["name"]]
            height = 2 * LINE + 18 + LINE * len(lines)
            heights.append(height)
            nodes[state["name"]] = Node(
                state["name"], state["kind"], lines, state["end"], x, y, node_width, height
            )
            x += node_width + NODE_GAP
        y += max(heights) + LAYER_GAP
    drawn = [edge for edge in described["edges"] if edge["from"] in nodes and edge["to"] in nodes]
    parallel = Counter((edge["from"], edge["to"]) for edge in drawn)
    seen: Counter[tuple[str, str]] = Counter()
    edges = []
    for edge in drawn:
        pair = (edge["from"], edge["to"])
        fan = (seen[pair] - (parallel[pair] - 1) / 2) * FAN  # 0 for a lone edge
        seen[pair] += 1
        edges.append(_edge(nodes[edge["from"]], nodes[edge["to"]], edge, layers, width, fan))
    bottom = y - LAYER_GAP + MARGIN
    placed = _without_overlaps(edges, list(nodes.values()), bottom)
    return Layout(tuple(nodes.values()), placed, width, bottom)


Box = tuple[float, float, float, float]


def label_box(edge: Edge) -> Box:
    """Where an edge's label is drawn (text from its baseline): left, top, right, bottom."""
    right = edge.label_x + LABEL_CHAR * len(edge.label)
    return (edge.label_x, edge.label_y - LINE + 3, right, edge.label_y + 3)


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _without_overlaps(edges: list[Edge], nodes: list[Node], height: float) -> tuple[Edge, ...]:
    """Each label moved down (else up) by a line at a time until it covers no label or state."""
    taken: list[Box] = [(n.x, n.y, n.x + n.width, n.y + n.height) for n in nodes]
    placed = []
    for edge in edges:
        if edge.label:
            for step in _steps(int(height // LINE) + 1):
                moved = replace(edge, label_y=edge.label_y + step * LINE)
                if not any(_overlap(label_box(moved), box) for box in taken):
                    edge = moved
                    break
            taken.append(label_box(edge))
        placed.append(edge)
    return tuple(placed)


def _steps(most: int) -> list[int]:
    """0, 1, -1, 2, -2, ...: the nearest free line first."""
    return [0] + [sign * n for n in range(1, most + 1) for sign in (1, -1)]


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


def _sized(state: dict[str, Any]) -> tuple[tuple[str, ...], float]:
    """A state's lines and the width that holds them and its name beside its kind.

    Wider than :data:`NODE_WIDTH` when they need it, at most :data:`NODE_MAX`;
    lines still too long are shortened to fit.
    """
    lines = _lines(state)
    heading = len(state["name"]) * NAME_CHAR + 12 + len(state["kind"]) * LABEL_CHAR
    longest = max((len(line) * LABEL_CHAR for line in lines), default=0)
    width = min(NODE_MAX, max(NODE_WIDTH, 20 + max(heading, longest)))
    fits = int((width - 20) // LABEL_CHAR)
    return tuple(_shorten(line, fits) for line in lines), width


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
    source: Node,
    target: Node,
    edge: dict[str, Any],
    layers: dict[str, int],
    width: float,
    fan: float,
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
            f"M{x1:.0f},{y1:.0f} C{x1 + fan:.0f},{y1 + bend:.0f} "
            f"{x2 + fan:.0f},{y2 - bend:.0f} {x2:.0f},{y2:.0f}"
        )
        # the curve's middle is 3/4 of the fan aside; the text beside it, on the outer side
        middle = (x1 + x2) / 2 + fan * 0.75
        if x2 < x1:  # leftwards: the text ends left of the curve
            return Edge(path, label, middle - 6 - LABEL_CHAR * len(label), (y1 + y2) / 2)
        return Edge(path, label, middle + 6, (y1 + y2) / 2)
    # back to an earlier layer (or a loop): round the right-hand side
    x1, y1 = source.x + source.width, source.y + source.height / 2
    x2, y2 = target.x + target.width, target.y + target.height / 2 + 8
    out = min(width - 10, max(x1, x2) + 60 + fan)
    path = f"M{x1:.0f},{y1:.0f} C{out:.0f},{y1:.0f} {out:.0f},{y2:.0f} {x2:.0f},{y2:.0f}"
    return Edge(path, label, out - 20, (y1 + y2) / 2)
