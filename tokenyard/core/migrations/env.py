"""Alembic environment: every table of the platform (teams and keys, the gateway's stored responses,
billing usage, the batch tier, the safety layer's policies and audit log).

Runs on the connection tokenyard.core.migrate passes in; from the alembic command line, on the
database the settings name.
"""

from alembic import context
from sqlalchemy import Connection
from sqlmodel import SQLModel

import tokenyard.batch.models
import tokenyard.billing.models
import tokenyard.gateway.chats.models
import tokenyard.gateway.responses.models
import tokenyard.guard.models
import tokenyard.tenancy.models
from tokenyard.core.db import database_url
from tokenyard.core.settings import get_settings

# imported for their tables in SQLModel.metadata
assert tokenyard.batch.models and tokenyard.billing.models and tokenyard.tenancy.models
assert tokenyard.gateway.chats.models
assert tokenyard.gateway.responses.models and tokenyard.guard.models


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=SQLModel.metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters by copying tables
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _migrate(connection)
else:
    from sqlalchemy import create_engine

    engine = create_engine(database_url(get_settings()))
    with engine.begin() as conn:
        _migrate(conn)
