"""Alembic migrations of the projection database, applied by ``svledger db upgrade``."""
