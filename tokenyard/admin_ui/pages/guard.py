"""Safety: the audit log of flags and blocks (filtered by team, end user, action, direction;
newest first, paged), and each team's safety policy (per category and direction: off, flag or
block, with a threshold)."""

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.exceptions import NotFoundException
from litestar.params import FromPath
from litestar.response import Redirect

from tokenyard.admin_ui import forms, render
from tokenyard.admin_ui.access import admin_only, in_thread, sql_of, tenancy_of
from tokenyard.guard import store
from tokenyard.guard.pii import KINDS
from tokenyard.guard.policy import (
    ACTIONS,
    DEFAULT,
    DIRECTIONS,
    PII,
    PII_ACTIONS,
    Policy,
    Rule,
    as_table,
    check,
    heads_of,
    terms_of,
)

PAGE = 50


def _guard(request: Request) -> Any:
    return getattr(request.app.state, "guard", None)


def _defaults(request: Request) -> dict[str, float]:
    guard = _guard(request)
    return dict(guard.defaults) if guard is not None else {}


def _policy_from_form(form: Any) -> tuple[Policy, dict[str, str]]:
    """Each rule's action and threshold from the form (blank threshold: the default)."""
    errors: dict[str, str] = {}
    rules: dict[str, dict[str, Rule]] = {d: {} for d in DIRECTIONS}
    for direction in DIRECTIONS:
        for head in heads_of(direction):
            name = f"{direction}.{head}"
            action = forms.text(form, f"{name}.action") or "off"
            raw = forms.text(form, f"{name}.threshold")
            threshold = None
            if action not in ACTIONS:
                errors[name] = f"action must be one of {', '.join(ACTIONS)}"
                continue
            if raw:
                try:
                    threshold = float(raw)
                except ValueError:
                    errors[name] = "a number between 0 and 1, or blank for the default"
                    continue
                if not 0.0 < threshold < 1.0:
                    errors[name] = "a number between 0 and 1, or blank for the default"
                    continue
            rules[direction][head] = Rule(action, threshold)  # type: ignore[arg-type]
    pii: dict[str, Any] = {}
    for kind in KINDS:
        action = forms.text(form, f"{PII}.{kind}.action") or "off"
        if action not in PII_ACTIONS:
            errors[f"{PII}.{kind}"] = f"action must be one of {', '.join(PII_ACTIONS)}"
        elif action != "off":
            pii[kind] = action
    store_text = forms.text(form, "store_text") == "on"
    terms = terms_of(forms.text(form, "terms").splitlines())
    policy = Policy(
        input=rules["input"], output=rules["output"], store_text=store_text, pii=pii, terms=terms
    )
    try:
        check(policy)
    except ValueError as exc:  # the blocklist's bounds: the rules were checked one by one above
        errors.setdefault("terms", str(exc))
    return policy, errors


class Guard(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/guard")
    async def audit(self, request: Request) -> Response:
        q = request.query_params
        team = q.get("team") or None
        action = q.get("action") if q.get("action") in ("flag", "block") else None
        direction = q.get("direction") if q.get("direction") in DIRECTIONS else None
        end_user = q.get("user") or None
        before = q.get("before")
        before_id = int(before) if before and before.isdigit() else None
        rows = await in_thread(
            store.audit_rows,
            sql_of(request),
            team=team,
            action=action,
            direction=direction,
            limit=PAGE,
            before_id=before_id,
            end_user=end_user,
        )
        teams = await tenancy_of(request).teams()
        return await render.page(
            request,
            "guard.html",
            rows=[store.to_dict(r) for r in rows],
            more=len(rows) == PAGE,
            team=team or "",
            action=action or "",
            direction=direction or "",
            user=end_user or "",
            teams=[t.name for t in teams],
            guard_on=_guard(request) is not None,
        )

    async def _policy_page(
        self,
        request: Request,
        name: str,
        policy: Policy | None,
        errors: dict[str, str],
        status: int,
    ) -> Response:
        if await tenancy_of(request).team(name) is None:
            raise NotFoundException(f"no team {name!r}")
        own = await in_thread(store.read_policy, sql_of(request), name)
        shown = policy or own or DEFAULT
        return await render.page(
            request,
            "guard_policy.html",
            status,
            team=name,
            own=own is not None,
            rows=as_table(shown, _defaults(request)),
            explicit={(d, h): r.threshold for d in DIRECTIONS for h, r in shown.rules(d).items()},
            store_text=shown.store_text,
            terms="\n".join(shown.terms),
            actions=ACTIONS,
            pii_actions=PII_ACTIONS,
            errors=errors,
            done=request.query_params.get("done", ""),
        )

    @get("/guard/policy/{name:str}")
    async def policy(self, request: Request, name: FromPath[str]) -> Response:
        return await self._policy_page(request, name, None, {}, 200)

    @post("/guard/policy/{name:str}")
    async def save_policy(self, request: Request, name: FromPath[str]) -> Response:
        form = await request.form()
        if await tenancy_of(request).team(name) is None:
            raise NotFoundException(f"no team {name!r}")
        if forms.text(form, "reset") == "1":
            await in_thread(store.delete_policy, sql_of(request), name)
        else:
            policy, errors = _policy_from_form(form)
            if errors:
                return await self._policy_page(request, name, policy, errors, 400)
            await in_thread(store.write_policy, sql_of(request), name, policy)
        guard = _guard(request)
        if guard is not None and guard.policies.redis is not None:
            await store.forget(guard.policies.redis, name)
        return Redirect(f"/admin/guard/policy/{name}?done=saved", status_code=303)
