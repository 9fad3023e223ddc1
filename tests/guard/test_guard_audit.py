"""The audit log's writer on each database: a row whose stored prompt holds a character
PostgreSQL's text refuses (NUL) is kept, and does not sink the other rows of its batch."""

from sqlalchemy import Engine

from tokenyard.guard.store import AuditLog, audit_rows


async def test_rows_with_nul_characters_are_stored_with_their_batch(database: Engine) -> None:
    log = AuditLog(database)
    for request_id, text in (("r1", "before\x00after"), ("r2", "plain"), ("r3", None)):
        log.record(
            request_id=request_id,
            team="audited",
            direction="input",
            action="block",
            categories=["illicit"],
            scores={"illicit": 0.93},
            model="m",
            text=text,
        )
    await log.flush()  # one batch, one commit
    rows = {r.request_id: r.text for r in audit_rows(database, team="audited")}
    assert rows == {"r1": "before\ufffdafter", "r2": "plain", "r3": None}
