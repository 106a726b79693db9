"""Durable record of sessions and completions (SQLAlchemy 2; SQLite or PostgreSQL)."""
