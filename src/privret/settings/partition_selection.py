"""Settings of the DP document selection (:mod:`privret.privacy.partition_selection`), torch-free."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PartitionSelectionConfig(BaseModel):
    """Budget and contribution bound of a DP document selection."""

    model_config = ConfigDict(extra="forbid")

    epsilon: float = Field(1.0, gt=0, allow_inf_nan=False, description="Laplace part (ledger adds ln(1/(1-delta)))")
    delta: float | None = Field(None, gt=0, lt=1, description="default 1/(10 n), n units")
    max_docs_per_unit: int = Field(1, gt=0, description="m: documents one unit may vote for")
