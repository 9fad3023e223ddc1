"""Tenancy: teams, their limits and their API keys (tables, management operations, and the policy
the request path reads), below every package that serves or manages a team's requests."""
