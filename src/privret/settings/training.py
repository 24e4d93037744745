"""The trainers' settings: validated pydantic models, free of torch so that reading a config never loads a model.

:class:`RetrieverTrainConfig` (with :class:`RecipeSelection`) configures the non-private retriever
(:mod:`privret.train.retriever`), :class:`GeneratorTrainConfig` (:class:`GeneratorSettings` with an epsilon)
the (DP) generator (:mod:`privret.train.generator`), :class:`DPRetrieverConfig` the direct DP retriever
(:mod:`privret.train.dp_retriever`). The privacy meaning of each field is stated in those modules.
:class:`DPRetrieverConfig`'s defaults are the regime docs/results.md measures; a batch size or number of epochs left
unset follows :func:`dp_schedule`, a rule of the number of units n, which privret treats as public.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from privret.settings.fields import changed_from_default
from privret.data.pairs import PrivacyUnit
from privret.errors import InputError
from privret.models.registry import DEFAULT_ENCODER, DEFAULT_GENERATOR
from privret.privacy.hold_out import UnitPartition


HOLD_OUT_FOR_TRAINING = ("train on the fit part of this partition of the log only (privret.privacy.hold_out), "
                         "keeping the held-out part for a DP choice at no added epsilon")
SELECTABLE = ("learning_rate", "temperature", "batch_size", "max_doc_tokens", "max_query_tokens", "warmup_fraction")


class RecipeSelection(BaseModel):
    """How :func:`privret.train.recipe.select_recipe` chooses a recipe on the training pairs alone.

    Every combination of ``grid`` (values of :data:`SELECTABLE` fields) is trained for
    ``max_epochs`` on the pairs outside a validation split (``validation_fraction`` of the query
    units, drawn with ``seed``) and scored by NDCG@10 on the validation queries after each whole
    epoch; the best (combination, epochs) is then retrained on all the pairs. ``validation_pool``:
    the validation queries search their relevant documents plus this many other documents of the
    corpus, drawn with ``seed`` (None: the whole corpus).
    """

    model_config = ConfigDict(extra="forbid")

    grid: dict[str, list[int | float]] = Field(default_factory=lambda: {"max_doc_tokens": [128, 256]})
    max_epochs: int = Field(3, ge=1)
    validation_fraction: float = Field(0.2, gt=0, lt=1)
    validation_pool: Optional[int] = Field(1000, ge=0)
    seed: int = 0

    @field_validator("grid")
    @classmethod
    def _known_fields(cls, grid: dict[str, list[int | float]]) -> dict[str, list[int | float]]:
        for name, values in grid.items():
            if name not in SELECTABLE:
                raise ValueError(f"'{name}' cannot be selected (choose from {', '.join(SELECTABLE)})")
            if not values:
                raise ValueError(f"'{name}' has no values")
        return grid


class RetrieverTrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = DEFAULT_ENCODER
    epochs: float = Field(1.0, gt=0, allow_inf_nan=False)
    batch_size: int = Field(32, gt=1)
    learning_rate: float = Field(2e-5, gt=0, allow_inf_nan=False)
    temperature: float = Field(0.05, gt=0, allow_inf_nan=False)
    warmup_fraction: float = Field(0.1, ge=0, lt=1)
    max_query_tokens: int = Field(64, gt=0)
    max_doc_tokens: int = Field(128, gt=0, description="truncation of documents during training only")
    bf16: bool = True
    seed: int = 0
    selection: Optional[RecipeSelection] = Field(
        None, description="choose epochs and the grid's settings on a validation split of the training pairs")

    @model_validator(mode="after")
    def _chosen_fields_not_given(self):
        """What the selection chooses replaces what is given: a value other than the default there is refused."""
        if self.selection is None:
            return self
        if given := changed_from_default(self, ("epochs", *self.selection.grid)):
            raise ValueError(f"`{given[0]}` is chosen by `selection` (epochs from 1 to its max_epochs, the rest from "
                             "its grid): the value given would be replaced")
        return self


class GeneratorSettings(BaseModel):
    """How the generator is fine-tuned, whatever its epsilon: what a pipeline's ``generator`` section gives once for
    every row of its epsilon grid (:class:`privret.settings.pipeline.GeneratorStage`)."""

    model_config = ConfigDict(extra="forbid")

    model: str = DEFAULT_GENERATOR
    start: Literal["prompted", "pretrained"] = Field(
        "prompted", description="without a warm start: 'prompted' shows public few-shot examples in every prompt, "
                                "in training and sampling (causal LMs; privret.train.public_start), 'pretrained' "
                                "the zero-shot prompt")
    delta: float | None = Field(None, description="default 1/(2n), n = number of units")
    clip_norm: float = Field(1.0, gt=0, allow_inf_nan=False)
    batch_size: int = Field(64, gt=0, description="expected number of units per step")
    epochs: float = Field(3.0, gt=0, allow_inf_nan=False)
    learning_rate: float = Field(2e-3, gt=0, allow_inf_nan=False)
    trainable: str = Field("lora", pattern="^(lora|full)$")
    lora_rank: int = Field(8, gt=0)
    trained_layers: int | None = Field(8, gt=0, description="train only the top k layers (None: all)")
    max_doc_tokens: int = Field(128, gt=0)
    max_query_tokens: int = Field(48, gt=0)
    physical_batch: int = Field(16, gt=0, description="rows per forward pass (memory, not privacy)")
    bf16: bool = Field(True, description="bf16 autocast (faster on AMX CPUs and GPUs)")
    accountant: str = "prv"
    seed: int = 0
    checkpoint_every: int = Field(10, gt=0)
    secure_rng: bool = Field(False, description="DP noise and Poisson sampling from the OS CSPRNG (os.urandom)")
    hold_out: UnitPartition | None = Field(None, description=HOLD_OUT_FOR_TRAINING)


class GeneratorTrainConfig(GeneratorSettings):
    """One generator fine-tune: the settings, its target epsilon and the privacy unit."""

    epsilon: float = Field(8.0, description="target epsilon; inf = non-private")
    unit: PrivacyUnit = PrivacyUnit.query

    @model_validator(mode="after")
    def _hold_out_is_for_dp(self):
        if self.hold_out is not None and not math.isfinite(self.epsilon):
            raise ValueError("`hold_out` keeps units for a DP choice; a non-private generator (epsilon inf) has no "
                             "guarantee to keep")
        return self


# The schedule of a direct DP run whose batch_size or epochs is not given (dp_schedule).
WHOLE_LOG_UP_TO = 1024  # units: up to this many, every unit joins every step (q = 1)
LARGE_LOG_BATCH = 512  # expected units per step past it
SCHEDULE_STEPS = 48  # about this many steps


def dp_schedule(n_units: int, batch_size: int | None = None) -> tuple[int, float]:
    """(expected batch, epochs) of a direct DP run over ``n_units`` units, ``batch_size`` when given.

    The rule: batch = n up to 1,024 units (the whole log in every step, q = 1), else 512; epochs = 48 q (q = batch
    / n, at most 1) rounded to whole epochs, or 48 q itself when under one epoch, so that the run takes about 48
    steps (T = ceil(epochs / q)). Its evidence is the two logs docs/results.md measures, the regime chosen on
    SQuAD's validation split and carried to SciFact before any SciFact run: SciFact, n = 807: 807 x 48 epochs (48
    steps); SQuAD, n = 5,747: 512 x 4 epochs (45 steps). Other sizes follow the rule, unmeasured.
    Privacy: n is the number of units the run trains on (the fit part under ``hold_out``); privret treats it as
    public (docs/privacy.md, "n is public"), as the sample rate q = B/n and the default delta 1/(2n) already do.
    """
    batch = batch_size or (max(2, n_units) if n_units <= WHOLE_LOG_UP_TO else LARGE_LOG_BATCH)
    epochs = SCHEDULE_STEPS * min(1.0, batch / n_units)
    return batch, float(round(epochs)) if epochs >= 1 else epochs


METHODS = ("naive", "batch-clip", "logit-dp", "public-negatives")
Method = Literal["naive", "batch-clip", "logit-dp", "public-negatives"]


class DPRetrieverSettings(BaseModel):
    """How the encoder is DP-trained, whatever its method, epsilon and privacy unit: what a pipeline's
    ``direct_dp.settings`` gives every row (and ``direct_dp.per_method`` one method's rows)."""

    model_config = ConfigDict(extra="forbid")

    model: str = DEFAULT_ENCODER
    delta: float | None = Field(None, description="default 1/(2n), n = number of units")
    clip_norm: float = Field(1.0, gt=0, allow_inf_nan=False, description="C (per unit / batch) or B (per pair)")
    batch_size: int | None = Field(None, gt=1, description="expected number of units per step (Poisson); default: "
                                                           "dp_schedule's rule of the number of units")
    max_batch_units: int | None = Field(None, gt=1, description="cap K on units per step (naive; logit-dp)")
    epochs: float | None = Field(None, gt=0, allow_inf_nan=False,
                                 description="default: dp_schedule's rule (about 48 steps)")
    learning_rate: float = Field(2e-3, gt=0, allow_inf_nan=False)
    temperature: float | None = Field(None, gt=0, allow_inf_nan=False,
                                      description="default 0.05, logit-dp 0.5")
    spreadout_weight: float = Field(0.0, ge=0, allow_inf_nan=False, description="logit-dp only")
    trainable: str = Field("bias-top:3", pattern=r"^(all|layers|lora|bias|(bias-)?top:[1-9][0-9]*)$")
    lora_rank: int = Field(8, gt=0)
    public_negatives: int | None = Field(None, ge=0, description="public-negatives: random public documents per "
                                                                 "step, shared by every row, without gradient; 0: "
                                                                 "none (then hard_negatives must be >= 1); default 1 "
                                                                 "with hard negatives, else 32")
    hard_negatives: int | None = Field(None, ge=0, description="public-negatives: per row, K of the top "
                                                               "hard_negative_depth public documents the initial "
                                                               "encoder ranks for its query, with gradient "
                                                               "(privret.train.hard_negatives); 0: none; default 2 "
                                                               "(the other methods take none)")
    hard_negative_depth: int = Field(30, gt=0, description="public-negatives: candidates per row for hard_negatives")
    physical_batch: int | None = Field(16, gt=0, description="public-negatives: units per forward pass (memory, "
                                                             "not privacy; None: the whole batch at once)")
    max_query_tokens: int = Field(64, gt=0)
    max_doc_tokens: int = Field(256, gt=0)
    dropout: bool = Field(False, description="dropout in the trained layers during training, asked for explicitly "
                                             "(False: every step runs the encoder in eval mode; on a CPU attention "
                                             "is several times faster without attention dropout)")
    accountant: str = "prv"
    seed: int = 0
    checkpoint_every: int = Field(10, gt=0, description="steps between checkpoints (resume with resume=True)")
    secure_rng: bool = Field(False, description="DP noise, sampling and a step's draws (truncation, row choice, "
                                                "negatives) from the OS CSPRNG (os.urandom); dropout masks never")
    hold_out: UnitPartition | None = Field(None, description=HOLD_OUT_FOR_TRAINING)


class DPRetrieverConfig(DPRetrieverSettings):
    """Configuration of :func:`privret.train.dp_retriever.train_dp_retriever`: the settings, the method (see that
    module's docstring for each), the target epsilon and the privacy unit."""

    method: Method = "public-negatives"
    epsilon: float = Field(8.0, gt=0, allow_inf_nan=False, description="target epsilon (finite)")
    unit: PrivacyUnit = PrivacyUnit.query

    @model_validator(mode="after")
    def _method_options(self):
        if self.hard_negatives is None:  # the defaults that depend on the method
            self.hard_negatives = 2 if self.method == "public-negatives" else 0
        if self.public_negatives is None:
            self.public_negatives = 1 if self.hard_negatives else 32
        if self.spreadout_weight and self.method != "logit-dp":
            raise ValueError("`spreadout_weight` applies to logit-dp only")
        if self.hard_negatives and self.method != "public-negatives":
            raise ValueError("`hard_negatives` applies to public-negatives only")
        if self.method == "public-negatives" and self.public_negatives + self.hard_negatives == 0:
            raise ValueError("public-negatives needs a negative per row: `public_negatives` or `hard_negatives` >= 1")
        return self

    def unused(self, fields) -> list[str]:
        """Those of ``fields`` this run ignores: another method's options, ``hard_negative_depth`` without hard
        negatives, ``lora_rank`` without LoRA.
        A command that names one method refuses them when given, as does a pipeline's ``per_method`` section; shared
        ``settings`` may hold them for the methods that take them."""
        used_by = {"physical_batch": self.method == "public-negatives",
                   "public_negatives": self.method == "public-negatives",
                   "hard_negative_depth": self.method == "public-negatives" and self.hard_negatives > 0,
                   "max_batch_units": self.method in ("naive", "logit-dp"),
                   "lora_rank": self.trainable == "lora"}
        return [f for f in fields if not used_by.get(f, True)]

    @property
    def tau(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return 0.5 if self.method == "logit-dp" else 0.05

    @property
    def cap(self) -> int:
        """K: ``max_batch_units``, default batch_size + ceil(4 sqrt(batch_size)) (of a :meth:`scheduled` config)."""
        return self.max_batch_units or self.batch_size + math.ceil(4 * math.sqrt(self.batch_size))

    def scheduled(self, n_units: int) -> DPRetrieverConfig:
        """This config with ``batch_size`` and ``epochs``, where unset (None), from :func:`dp_schedule` of the
        ``n_units`` units the run trains on; public-negatives only (the other methods need both given)."""
        if self.batch_size is not None and self.epochs is not None:
            return self
        if self.method != "public-negatives":  # naive's sensitivity grows with the batch, logit-dp's cost with B^2
            raise InputError(f"has no default for {self.method}: the schedule rule is public-negatives' measured "
                             "regime; give `batch_size` and `epochs`",
                             field="batch_size" if self.batch_size is None else "epochs")
        batch_size, epochs = dp_schedule(n_units, self.batch_size)
        return self.model_copy(update={"batch_size": batch_size, "epochs": self.epochs or epochs})


class CandidateGrid(BaseModel):
    """The candidates of a DP choice among retrievers (:mod:`privret.privacy.private_selection`): the public base,
    and each fine-tuned retriever interpolated with it at ``weights``; and the token limit when scoring them."""

    model_config = ConfigDict(extra="forbid")

    weights: list[float] = Field(default_factory=lambda: [0.5, 1.0],
                                 description="interpolation weights alpha in (0, 1] of each candidate with base")
    max_seq_length: int = Field(256, gt=0, description="token limit of queries and documents when scoring")

    @field_validator("weights")
    @classmethod
    def _weights_in_range(cls, weights: list[float]) -> list[float]:
        if not weights or any(not 0 < w <= 1 for w in weights):
            raise ValueError("give one or more weights in (0, 1] (the base model itself is always a candidate)")
        return sorted(set(weights))


class SelectionSettings(CandidateGrid):
    """How a DP choice among retrievers is made: its candidates and its epsilon."""

    epsilon: float = Field(1.0, gt=0, allow_inf_nan=False, description="epsilon of the choice (pure DP, delta 0)")


class PrivateSelectionConfig(SelectionSettings):
    """Configuration of :func:`privret.train.private_selection.select_retriever`: a DP choice among ``base``,
    each of ``candidates``, and their interpolations with ``base`` at ``weights``, by NDCG@10 on the
    private log (see :mod:`privret.privacy.private_selection` for the guarantee)."""

    base: str = Field(DEFAULT_ENCODER, description="the public model the candidates were fine-tuned from")
    candidates: list[str] = Field(default_factory=list, description="fine-tuned retrievers (directories)")
    unit: PrivacyUnit = PrivacyUnit.query
    hold_out: UnitPartition | None = Field(None, description="score on the held-out part of this partition of the "
                                                             "log only: with candidates trained on its fit part, the "
                                                             "choice and they compose in parallel")
