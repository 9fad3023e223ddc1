"""Tenancy fixtures: the gateway tests' redis-server (every key these tests cache is their own),
and the billing tests' migrated databases (SQLite and PostgreSQL)."""

from tests.billing.conftest import billing_db, postgres  # noqa: F401 - fixtures, by name
from tests.gateway.conftest import redis_server  # noqa: F401 - a fixture, by name
