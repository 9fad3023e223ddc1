"""The admin UI, served by the gateway under /admin: sign-in, teams and their quotas, keys, the
usage dashboard (server-drawn SVG charts), a team's own usage page and live status. See
docs/admin_ui.md."""
