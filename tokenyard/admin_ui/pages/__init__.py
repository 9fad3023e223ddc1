"""The admin UI's pages, one module per page (admin_ui/app.py mounts them)."""
