"""The embedded engine's request bodies: sglang's wire format, the subset the engine honours
(docs/architecture.md, "Engines"). Unknown fields of a body are ignored, as sglang's request
dataclasses ignore them; an unknown sampling parameter is refused, as sglang's
`SamplingParams(**sampling_kwargs)` (srt/managers/tokenizer_manager.py) refuses it."""

from __future__ import annotations

import uuid

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.batcher import Sampling


class SamplingParams(BaseModel):
    """`/generate`'s `sampling_params`: the subset of sglang's that the engine honours."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(default=128, ge=0)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = -1  # -1: no top-k
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    sampling_seed: int | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, top_k: int) -> int:
        """As sglang's `SamplingParams.verify` (sglang/srt/sampling/sampling_params.py): 0 is refused."""
        if top_k < 1 and top_k != -1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
        return top_k

    def sampling(self) -> Sampling:
        """The batcher's sampling record of these parameters."""
        return Sampling(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop_token_ids=tuple(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            seed=self.sampling_seed,
        )


class GenerateRequest(BaseModel):
    """`/generate`'s body: token IDs in, as sglang's `GenerateReqInput` takes them."""

    # sglang has many more fields; those that change sampling are in SamplingParams
    model_config = ConfigDict(extra="ignore")

    input_ids: list[int] = Field(min_length=1)
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = False
    stream: bool = False
    rid: str = Field(default_factory=lambda: uuid.uuid4().hex)  # what `/abort_request` names

    @field_validator("rid", mode="before")
    @classmethod
    def _rid(cls, rid: str | None) -> str:
        """An absent rid is a fresh one, as sglang's `GenerateReqInput` gives."""
        if not rid:
            return uuid.uuid4().hex
        return rid


class AbortRequest(BaseModel):
    """`/abort_request`'s body, as sglang's `AbortReq`: an rid, or `abort_all`."""

    model_config = ConfigDict(extra="ignore")

    rid: str | None = None  # sglang reads None as ""
    abort_all: bool = False


class WeightVersionRequest(BaseModel):
    """`/update_weight_version`'s body."""

    model_config = ConfigDict(extra="ignore")

    new_version: str
    abort_all_requests: bool = True


class UpdateWeightsRequest(BaseModel):
    """`/update_weights_from_disk`'s body."""

    model_config = ConfigDict(extra="ignore")

    model_path: str
    weight_version: str | None = None
