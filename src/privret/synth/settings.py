"""The synthesis stages' settings (torch-free pydantic models): generation
(:mod:`privret.synth.generate`) and the round-trip filter (:mod:`privret.synth.filter`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from privret.models.registry import DEFAULT_ENCODER


class GenerateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_queries: int = Field(1, gt=0, description="queries per document")
    top_p: float = Field(0.8, gt=0, le=1, allow_inf_nan=False)
    temperature: float = Field(1.0, gt=0, allow_inf_nan=False)
    max_new_tokens: int = Field(48, gt=0)
    batch_size: int = Field(32, gt=0)
    seed: int = 0


class RoundTripFilterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    encoder: str = Field(DEFAULT_ENCODER, description="a public encoder (never one trained on the private data)")
    top_k: int = Field(20, gt=0, description="keep (q, d) when d is among q's top_k documents")
    batch_size: int = Field(64, gt=0)
