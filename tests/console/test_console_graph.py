"""The machine graph's layout: states top to bottom in the order labels pass, loops to the side."""

from __future__ import annotations

from routemaster.config import describe_machine
from routemaster.config.model import Config
from routemaster.console.graph import layout


def test_states_are_layered_by_distance_from_the_first(config: Config) -> None:
    drawn = layout(describe_machine(config.get_machine("user")))
    nodes = {node.name: node for node in drawn.nodes}
    assert nodes["start"].y < nodes["review"].y < nodes["notify"].y
    assert nodes["review"].y == nodes["done"].y  # both one step from start
    assert all(node.x >= 0 and node.x + node.width <= drawn.width for node in nodes.values())
    assert all(node.y + node.height <= drawn.height for node in nodes.values())
    assert nodes["review"].lines == ("on entry", "on metadata.approved")
    assert nodes["done"].end and nodes["done"].lines == ("end state",)


def test_edges_carry_their_rule_and_back_edges_go_round_the_side(config: Config) -> None:
    drawn = layout(describe_machine(config.get_machine("user")))
    labels = sorted(edge.label for edge in drawn.edges)
    assert labels == ["", "", "= fast", "otherwise"]
    nodes = {node.name: node for node in drawn.nodes}
    # notify (third layer) -> done (second layer) goes back up, round the right-hand side
    notify, done = nodes["notify"], nodes["done"]
    start = f"M{notify.x + notify.width:.0f},"
    [back] = [edge for edge in drawn.edges if edge.path.startswith(start)]
    assert back.path.endswith(f" {done.x + done.width:.0f},{done.y + done.height / 2 + 8:.0f}")
    assert back.label_x > max(notify.x + notify.width, done.x + done.width) - 20


def test_a_single_state_machine_is_drawn(config: Config) -> None:
    drawn = layout(describe_machine(config.get_machine("empty")))
    assert [node.name for node in drawn.nodes] == ["only"]
    assert drawn.edges == ()
