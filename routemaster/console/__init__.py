"""The web console under ``/console/``: server-rendered pages over the same label service.

Every page is complete HTML without JavaScript; ``static/console.js`` only
adds live updates from the changes stream. A page that shows counts or a
label reads them in one snapshot and tells the script that snapshot, so the
script applies exactly the changes the page does not show yet (see
:class:`~routemaster.service.snapshots.Snapshot`).
"""

from routemaster.console import (
    bulk_action,  # noqa: F401 (its pages join the blueprint)
    flows_page,  # noqa: F401 (its page joins the blueprint)
    subscriptions_page,  # registers its page on the blueprint
)
from routemaster.console import versions_page as _versions  # noqa: F401  (its routes)
from routemaster.console.views import blueprint

__all__ = ["blueprint", "subscriptions_page"]
