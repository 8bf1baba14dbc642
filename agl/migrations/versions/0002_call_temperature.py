"""Each call records the temperature it was sampled at (log-probs are only comparable at it).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.add_column("calls", sa.Column("temperature", sa.Float, nullable=True))  # NULL: not recorded


def downgrade() -> None:
    op.drop_column("calls", "temperature")
