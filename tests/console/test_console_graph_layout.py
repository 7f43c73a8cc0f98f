"""The machine graph's layout: states top to bottom in the order labels pass, loops to the side."""

from __future__ import annotations

from pathlib import Path

from routemaster.config import describe_machine
from routemaster.config.loader import load_config
from routemaster.config.model import Config
from routemaster.console.graph_layout import label_box, layout


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


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_the_labels_of_edges_leaving_one_state_do_not_overlap() -> None:
    """example.yaml's ship: "= courier" and "otherwise" both lead to awaiting_delivery."""
    config = load_config([Path(__file__).parents[2] / "example.yaml"])
    drawn = layout(describe_machine(config.get_machine("order")))
    labelled = [edge for edge in drawn.edges if edge.label]
    assert sorted(edge.label for edge in labelled) == ["= collect", "= courier", "otherwise"]
    for i, edge in enumerate(labelled):
        for other in labelled[i + 1 :]:
            assert not _overlap(label_box(edge), label_box(other)), (edge.label, other.label)
        for node in drawn.nodes:
            box = (node.x, node.y, node.x + node.width, node.y + node.height)
            assert not _overlap(label_box(edge), box), (edge.label, node.name)
    # two edges between the same states are two curves, each with its label beside it
    courier, otherwise = sorted(
        (edge for edge in labelled if edge.label != "= collect"), key=lambda edge: edge.label
    )
    assert courier.path != otherwise.path
