"""Start-time fair queuing over keys (SPEC G2): shares by weight, no credit for idling, FIFO
within a key, and the caller's batches of keys served as one."""

from __future__ import annotations

from collections import Counter

from routemaster.machine.fair_share import KeyQueue, serve


def _queues(**weights: float) -> list[KeyQueue[str]]:
    return [
        KeyQueue(key, 0.0, weight, [f"{key}{i}" for i in range(1000)])
        for key, weight in weights.items()
    ]


def test_backlogged_keys_share_in_proportion_to_their_weights() -> None:
    served = serve(_queues(a=3, b=1, c=1), 500)
    shares = Counter(label[0] for label in served.chosen)
    assert abs(shares["a"] - 300) <= 2 and abs(shares["b"] - 100) <= 2
    for n in range(1, 501):  # every prefix: at least floor(n*w/W) - 1 each
        prefix = Counter(label[0] for label in served.chosen[:n])
        assert prefix["a"] >= n * 3 // 5 - 1 and prefix["b"] >= n // 5 - 1


def test_within_a_key_labels_go_in_order_and_virtual_starts_move_by_one_over_weight() -> None:
    served = serve(_queues(a=2, b=1), 6)
    assert [label for label in served.chosen if label[0] == "a"] == ["a0", "a1", "a2", "a3"]
    assert served.vstarts == {"a": 2.0, "b": 2.0}
    assert served.vtime == 1.5


def test_a_key_that_was_idle_earns_no_credit() -> None:
    """Its start is raised to the flow's virtual time (by the store): it takes turns from
    there, not a burst for the time it was away."""
    busy = KeyQueue("busy", 100.0, 1.0, [f"busy{i}" for i in range(10)])
    back = KeyQueue("back", 100.0, 1.0, [f"back{i}" for i in range(10)])
    order = [label[:4] for label in serve([busy, back], 6).chosen]
    assert order == ["back", "busy"] * 3


def test_keys_not_read_yet_are_never_passed() -> None:
    first = KeyQueue("a", 0.0, 1.0, ["a0", "a1", "a2"])
    served = serve([first], 3, below=(1.0, "b"))
    # a1 starts at (1.0, "a"), before the unread key b; a2 would start at 2.0, after it
    assert served.chosen == ["a0", "a1"]
    assert first.heads == ["a2"] and first.vstart == 2.0
