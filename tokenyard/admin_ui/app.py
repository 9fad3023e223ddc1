"""The /admin router the app mounts: sign-in, teams, keys, the usage dashboard, live status, and a
team's own usage page (admin_ui/pages/, one module per page). Every route but the sign-in forms
and the stylesheet needs a session (guards, admin_ui/access.py); every form is CSRF-checked
(csrf.verify, before each handler)."""

from litestar import Router
from litestar.exceptions import HTTPException

from tokenyard.admin_ui import csrf
from tokenyard.admin_ui.access import refuse
from tokenyard.admin_ui.pages.alerts import Alerts
from tokenyard.admin_ui.pages.changes import Changes
from tokenyard.admin_ui.pages.guard import Guard
from tokenyard.admin_ui.pages.keys import Keys
from tokenyard.admin_ui.pages.requests import Requests
from tokenyard.admin_ui.pages.sign_in import SignIn
from tokenyard.admin_ui.pages.status import Status
from tokenyard.admin_ui.pages.teams import Teams
from tokenyard.admin_ui.pages.usage import AdminUsage, TeamUsage
from tokenyard.admin_ui.pages.webhooks import Webhooks

admin_router = Router(
    path="/admin",
    route_handlers=[
        SignIn,
        AdminUsage,
        Teams,
        Keys,
        Status,
        TeamUsage,
        Guard,
        Alerts,
        Webhooks,
        Changes,
        Requests,
    ],
    before_request=csrf.verify,
    exception_handlers={HTTPException: refuse},
    include_in_schema=False,
)
