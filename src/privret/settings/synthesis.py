"""The synthesis stages' settings (torch-free pydantic models): the documents to write queries for
(:mod:`privret.synth.documents`), generation (:mod:`privret.synth.generate`) and the round-trip
filter (:mod:`privret.synth.filter`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from privret.settings.fields import ConfigPath, changed_from_default
from privret.models.registry import DEFAULT_ENCODER
from privret.settings.partition_selection import PartitionSelectionConfig


class GenerateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_queries: int = Field(1, gt=0, description="queries per document")
    top_p: float = Field(0.8, gt=0, le=1, allow_inf_nan=False)
    temperature: float = Field(1.0, gt=0, allow_inf_nan=False)
    repetition_penalty: float = Field(1.2, ge=1, allow_inf_nan=False, description=(
        "CTRL repetition penalty on the tokens the output has already sampled (not the prompt's): a positive logit "
        "divided by it, a negative one multiplied, before temperature and top_p; 1 = off. Default: the smallest "
        "penalty of 1, 1.1, 1.2, 1.3 and 1.5 with the most query-like outputs (privret.synth.queryness) of the "
        "prompted epsilon-0 generator on public documents only (the demo's help-desk corpus and 100 SciFact "
        "documents), its degenerate share no higher than without a penalty (docs/results.md)"))
    max_new_tokens: int = Field(48, gt=0)
    batch_size: int = Field(32, gt=0)
    seed: int = 0
    first_sentence: bool = Field(True, description="keep each output up to its first sentence end (., ? or ! "
                                                   "followed by more text): post-processing of the output alone")
    drop_degenerate: bool = Field(True, description="drop empty, one-word, document-copy and repeated-run outputs "
                                                    "(privret.synth.queryness): post-processing of the output and "
                                                    "its public document")

    def recorded(self) -> dict:
        """The settings as a run records them to check a resumed or repeated run against (JSON): every field, but
        ``repetition_penalty`` only when on, so that a record without it stands for sampling without a penalty."""
        settings = self.model_dump(mode="json")
        if self.repetition_penalty == 1.0:
            del settings["repetition_penalty"]
        return settings


class RoundTripFilterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    encoder: str = Field(DEFAULT_ENCODER, description="a public encoder (never one trained on the private data)")
    top_k: int = Field(20, gt=0, description="keep (q, d) when d is among q's top_k documents")
    batch_size: int = Field(64, gt=0)


REMOVED_SOURCE = ("'training' (the documents of the private pairs) was removed: which documents carry private "
                  "queries is private, so choosing them that way leaked the log; use 'corpus', a public 'list', "
                  "or 'dp-select'")


class DocumentChoice(BaseModel):
    """Where the synthetic set's documents come from (see :mod:`privret.synth.documents`)."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["corpus", "list", "dp-select"] = "corpus"
    ids_file: ConfigPath | None = Field(None, description="source 'list': public document ids, one per line")
    sample: int | None = Field(None, gt=0, description="keep a seeded uniform random subset of this many documents")
    seed: int = 0
    selection: PartitionSelectionConfig = PartitionSelectionConfig()

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value):
        if value == "training" or (isinstance(value, dict) and value.get("source") == "training"):
            raise ValueError(REMOVED_SOURCE)
        return {"source": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _list_has_file(self):
        if (self.source == "list") != (self.ids_file is not None):
            raise ValueError("ids_file is required with source 'list', and only then")
        if self.source != "dp-select" and changed_from_default(self, ["selection"]):
            raise ValueError("its selection settings are for source 'dp-select' only; with source "
                             f"'{self.source}' no document is chosen from the private log")
        return self
