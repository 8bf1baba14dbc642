"""Each call records the temperature it was sampled at (log-probs are only comparable at it)."""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.add_column("calls", sa.Column("temperature", sa.Float, nullable=True))  # NULL: not recorded
