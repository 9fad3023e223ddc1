"""Tenancy fixtures: the gateway tests' redis-server (every key these tests cache is their own)."""

from tests.gateway.conftest import redis_server  # noqa: F401 - a fixture, by name
