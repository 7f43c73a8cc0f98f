"""Fan-out and fan-in in a worker (SPEC G3): children spawned once each, the parent decides
by ``wait`` as soon as the deciding child finishes."""

from __future__ import annotations

from routemaster import service
from tests.worker.children import config, rows
from tests.waiting import wait_until
from tests.worker.conftest import MakeApp, running


def test_a_parent_waits_for_all_its_children_then_leaves_by_their_counts(
    make_app: MakeApp,
) -> None:
    app = make_app(config())
    order, item = app.config.get_machine("order"), app.config.get_machine("item")
    with running(app):
        service.create_label(app, order, "o1", {"items": ["a", "b", "c"]})
        wait_until(
            lambda: len(rows(app, "SELECT name FROM labels WHERE state_machine = 'item'")) == 3,
            "three children",
        )
        child = service.get_label(app, item, "o1/1")
        assert child.metadata == {"item": "b", "parent": {"state_machine": "order", "label": "o1"}}
        service.update_metadata(app, item, "o1/0", {"ok": True})
        service.update_metadata(app, item, "o1/1", {"ok": True})
        assert service.get_label(app, order, "o1").state == "pick"
        service.update_metadata(app, item, "o1/2", {"bad": True})
        wait_until(lambda: service.get_label(app, order, "o1").state == "partial", "decided")
