"""The admin UI's Safety pages: the audit log (filters, no text unless a policy opts in) and a
team's policy form (saved, refused when wrong, reset)."""

from typing import Any

import openai

from tests.admin_ui.conftest import csrf_of, sign_in
from tests.gateway.conftest import MODEL, Gateway, wait_until
from tests.guard.conftest import classifier, texts  # noqa: F401 - fixtures, by name
from tokenyard.guard import store


def test_audit_log_and_policy_form(
    admin_gateway: Gateway,
    team: Any,
    sql: Any,
    texts: Any,  # noqa: F811
) -> None:
    name, key = team()
    client = admin_gateway.client(key)
    reply = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": texts.harmful}],
        max_tokens=3,
        user="user-77",
    )
    request_id = reply.headers["x-request-id"]
    wait_until(lambda: store.audit_rows(sql, request_id=request_id), 10, "flag row")

    admin = sign_in(admin_gateway.url)
    try:
        page = admin.get("/admin/guard", params={"team": name})
        assert page.status_code == 200
        assert request_id in page.text and "flag" in page.text
        assert texts.harmful not in page.text  # scores only: the default keeps no text
        assert "Safety" in page.text  # in the navigation
        empty = admin.get("/admin/guard", params={"team": name, "action": "block"})
        assert request_id not in empty.text
        # by end user: the row names who the request was for
        assert "<td>user-77</td>" in page.text
        theirs = admin.get("/admin/guard", params={"team": name, "user": "user-77"})
        assert request_id in theirs.text
        others = admin.get("/admin/guard", params={"team": name, "user": "user-78"})
        assert request_id not in others.text

        form_page = admin.get(f"/admin/guard/policy/{name}")
        assert form_page.status_code == 200 and "platform default" in form_page.text
        assert 'name="pii.email.action"' in form_page.text and ">mask</option>" in form_page.text
        fields = {"csrf": csrf_of(form_page), "input.illicit.action": "block"}
        fields["input.illicit.threshold"] = "0.6"
        fields["pii.email.action"], fields["pii.secret.action"] = "mask", "block"
        fields["terms"] = "Project Falcon\n\n  ACME  \nacme"
        for direction, heads in (("input", ["violence", "jailbreak"]), ("output", ["hate"])):
            for head in heads:
                fields[f"{direction}.{head}.action"] = "flag"
        saved = admin.post(f"/admin/guard/policy/{name}", data=fields)
        assert saved.status_code == 303
        policy = store.read_policy(sql, name)
        assert policy is not None
        assert policy.input["illicit"].action == "block"
        assert policy.input["illicit"].threshold == 0.6
        assert policy.input["sexual"].action == "off"  # not in the form: off
        assert policy.output["hate"].action == "flag"
        assert policy.pii == {"email": "mask", "secret": "block"}  # the kinds not sent: off
        assert policy.terms == ("Project Falcon", "ACME")  # trimmed, blanks and repeats dropped
        assert "Project Falcon\nACME</textarea>" in admin.get(f"/admin/guard/policy/{name}").text

        bad = dict(fields, **{"input.illicit.threshold": "7"})
        bad["csrf"] = csrf_of(admin.get(f"/admin/guard/policy/{name}"))
        refused = admin.post(f"/admin/guard/policy/{name}", data=bad)
        assert refused.status_code == 400 and "between 0 and 1" in refused.text
        masked = dict(fields, **{"pii.phone.action": "mask@0.5"})  # no such action
        masked["csrf"] = csrf_of(admin.get(f"/admin/guard/policy/{name}"))
        refused = admin.post(f"/admin/guard/policy/{name}", data=masked)
        assert refused.status_code == 400 and "action must be one of" in refused.text
        assert store.read_policy(sql, name).input["illicit"].threshold == 0.6  # type: ignore

        # the gateway applies it: the prompt it flagged is now blocked
        def blocked() -> bool:
            try:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": texts.harmful}]
                )
            except openai.BadRequestError:
                return True
            return False

        wait_until(blocked, 10, "the saved policy applied")
        token = csrf_of(admin.get(f"/admin/guard/policy/{name}"))
        reset = admin.post(f"/admin/guard/policy/{name}", data={"csrf": token, "reset": "1"})
        assert reset.status_code == 303 and store.read_policy(sql, name) is None
        assert admin.get("/admin/guard/policy/no-such-team").status_code == 404
    finally:
        admin.close()
