"""A call may be stored as the extension of an earlier call of its rollout (`agl/store/chains.py`)."""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.add_column(
        "calls", sa.Column("base", sa.JSON, nullable=True)
    )  # NULL: stored whole, as before 0003
