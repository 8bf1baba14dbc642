"""The sample adapter: recorded calls -> training samples with rollout-level advantage and loss weights.

`build_batch` is the trainer's entry point (docs/architecture.md, "From calls to samples").
Imports only agl, numpy and pydantic.
"""

from adapters.advantage import ESTIMATORS, Estimator
from adapters.batch import Batch, build_batch
from adapters.settings import AdapterError, AdapterSettings

__all__ = ["ESTIMATORS", "AdapterError", "AdapterSettings", "Batch", "Estimator", "build_batch"]
