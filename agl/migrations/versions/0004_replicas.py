"""Gateway replicas over one database: their registrations, the fleet's pause and served version,
the gateway that recorded each call, and each rollout's bytes counted against its budget."""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.create_table(
        "gateways",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
        sa.Column("drained_epoch", sa.Integer, nullable=False),
    )
    fleet = op.create_table(
        "fleet",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("version", sa.Integer, nullable=True),
        sa.Column("serial", sa.Integer, nullable=False),
    )
    # The one row: not paused, no pause yet, the latest registered model served.
    op.bulk_insert(fleet, [{"id": 1, "paused": False, "epoch": 0, "version": None, "serial": 0}])
    # NULL: recorded before 0004, by a gateway that is not running any more.
    op.add_column("calls", sa.Column("gateway", sa.String(64), nullable=True))
    # NULL: recorded before 0004 (its request is compared whole).
    op.add_column("calls", sa.Column("request_hash", sa.String(32), nullable=True))
    # Rollouts made before 0004 count their bytes from here on.
    op.add_column(
        "rollouts",
        sa.Column("sent_bytes", sa.BigInteger, nullable=False, server_default="0"),
    )
