"""Run results: the schema (records, statuses, exit codes), the store (files on disk), the environment."""
