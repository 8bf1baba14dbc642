"""The first schema: rollouts, calls, events, models (docs/architecture.md, "The data model")."""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("task", sa.JSON, nullable=False),
        sa.Column("group_id", sa.String(255), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("reward", sa.Float, nullable=True),
        sa.Column("failure_kind", sa.String(16), nullable=True),
        sa.Column("metadata", sa.JSON, nullable=False),
        sa.Column("agent_token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("grader_token_hash", sa.String(64), nullable=True, unique=True),
        sa.Column("n_calls", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("ended_at", sa.Float, nullable=True),
        sa.Column("end_seq", sa.Integer, nullable=True, unique=True),
    )
    op.create_index("ix_rollouts_group_id", "rollouts", ["group_id"])
    op.create_index("ix_rollouts_status", "rollouts", ["status"])
    op.create_table(
        "calls",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("rollout_id", sa.String(64), sa.ForeignKey("rollouts.id"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("agent", sa.String(255), nullable=False),
        sa.Column("model_version", sa.Integer, nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("response", sa.JSON, nullable=False),
        sa.Column("prompt_ids", sa.LargeBinary, nullable=False),
        sa.Column("response_ids", sa.LargeBinary, nullable=False),
        sa.Column("logprobs", sa.LargeBinary, nullable=False),
        sa.Column("finish_reason", sa.String(32), nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("rollout_id", "seq", name="uq_calls_rollout_seq"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("rollout_id", sa.String(64), sa.ForeignKey("rollouts.id"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("data", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_events_rollout", "events", ["rollout_id", "id"])
    op.create_table(
        "models",
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("endpoints", sa.JSON, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
