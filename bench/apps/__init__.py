"""Command-line apps: parse, call, print. Statuses are returned, never kept in module globals."""
