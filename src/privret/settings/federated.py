"""Configuration of a federated PDD-AS2 run (thesis chapters 3 and 4)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from privret.settings.fields import changed_from_default
from privret.models.device_spec import DeviceSpec
from privret.models.registry import DEFAULT_ENCODER


RUNTIME_FIELDS = {"round_timeout", "device"}  # how a run is carried out, not what it computes: a saved result stays


def without_runtime(settings: dict) -> dict:
    """A dumped :class:`FedConfig` without :data:`RUNTIME_FIELDS`: what two runs must share for one's saved
    results to stand for the other's."""
    return {k: v for k, v in settings.items() if k not in RUNTIME_FIELDS}


class FedConfig(BaseModel):
    """Every knob of ``privret federated train``; also the Flower run config (flattened, see ``to_run_config``).

    Stage 1 (thesis 3.3): ``rounds`` FedAvg rounds of ``local_epochs`` local epochs each; the first
    ``warmup_rounds`` rounds use BM25 negatives, later rounds static hard negatives mined by the
    current model at the start of each local epoch (``n_negatives`` sampled uniformly from the top
    ``hard_k``, excluding the gold answer sentences: the query-hubness remedy of thesis 3.4.6).
    Stage 2 (thesis 4.2): for each variant in ``personalize`` ("local": client-customized query
    encoders with local dynamic hard negatives; "fed": the same plus Fed-Negative), every client
    fine-tunes its own copy of the query encoder for ``personal_epochs`` epochs with the sentence
    encoder frozen. Under DP (``dp`` server or client) nothing a client's own data size moves may leave it,
    so stage 2 is ``local`` by default and ``fed`` is refused (it sends one embedding per training question).

    What a round costs: only the ``trainable`` parameters (:func:`privret.models.trainable.make_trainable`;
    default ``layers``: the embeddings stay frozen and at home) travel, as ``wire_dtype`` (weights down,
    updates up: :mod:`privret.federated.wire`); hard negatives are re-mined every ``remine_every``-th hard
    round (:func:`privret.federated.local.round_stage`); ``eval_every`` adds evaluations of the global
    model between rounds (for a learning curve; each costs an encoding of every collection).
    """

    model_config = ConfigDict(extra="forbid")

    model: str = DEFAULT_ENCODER
    rounds: int = Field(2, ge=0)
    warmup_rounds: int = Field(1, ge=0)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(16, gt=1)
    learning_rate: float = Field(3e-5, gt=0, allow_inf_nan=False)
    temperature: float = Field(0.05, gt=0, allow_inf_nan=False)
    n_negatives: int = Field(2, ge=0)
    hard_k: int = Field(30, ge=1)
    bm25_k: int = Field(10, ge=1)
    max_query_tokens: int = Field(32, gt=0)
    max_sentence_tokens: int = Field(96, gt=0)
    train_fraction: float = Field(1.0, gt=0, le=1, description="seeded share of each client's training questions")
    max_train_questions: int = Field(0, ge=0, description="cap per client (0 = all), for quick runs")
    bf16: bool = True
    seed: int = 0
    # what a round costs (docs/federated.md, "What a round costs")
    trainable: str = Field("layers", pattern=r"^(all|layers|lora|bias|(bias-)?top:[1-9][0-9]*)$",
                           description="parameters trained and exchanged (privret.models.trainable)")
    lora_rank: int = Field(8, gt=0)
    wire_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float16", description="type of the exchanged parameters: weights down, updates up (privret.federated.wire)")
    remine_every: int = Field(1, ge=1, description="hard negatives re-mined every k-th hard round (1 = each round)")
    eval_every: int = Field(0, ge=0, description="evaluate the global model every k rounds (0 = at the end only)")
    evaluation_split: Literal["test", "validation"] = Field(
        "test", description="questions the evaluations score: test, or validation (each client's training questions "
                            "that train_fraction leaves out; for choosing settings without looking at test)")
    per_query_metrics: bool = Field(False, description="evaluation replies carry each test question's reciprocal "
                                                       "rank (paired statistics; the server sees per-question results)")
    # stage 2: client-customized query encoders and Fed-Negative
    personalize: list[Literal["local", "fed"]] = Field(
        default_factory=lambda: ["local", "fed"],
        description="stage-2 variants (default both; with dp server or client only local: Fed-Negative is refused)")
    personal_epochs: int = Field(1, ge=1)
    personal_learning_rate: float = Field(1e-5, gt=0, allow_inf_nan=False)
    personal_batch_size: int = Field(32, gt=1)
    personal_negatives: int = Field(16, ge=0, description="local dynamic hard negatives per query")
    personal_hard_k: int = Field(100, ge=1)
    fed_negatives: int = Field(16, ge=1, description="n of eqs. 4.1-4.2: top-n kept across clients")
    fed_select: int = Field(0, ge=0, description="|C_s| other clients asked (0 = all others)")
    # optional client-level DP on the FedAvg updates (Flower's strategy wrappers)
    dp: Literal["none", "server", "client"] = "none"
    dp_noise_multiplier: float = Field(1.0, ge=0, allow_inf_nan=False)
    dp_clip_norm: float = Field(1.0, gt=0, allow_inf_nan=False)
    dp_delta: float = Field(1e-3, gt=0, lt=1)
    round_timeout: float = Field(3600.0, gt=0, allow_inf_nan=False,
                                 description="seconds the server waits for every client's reply before it stops")
    device: DeviceSpec = Field("auto", description="where each process runs its models: auto, cpu, cuda or cuda:N "
                                            "(privret.models.device)")

    @model_validator(mode="before")
    @classmethod
    def _default_personalize(cls, values):
        """Under DP the default stage 2 is ``local`` only: Fed-Negative (``fed``) cannot run there (:meth:`_check`)."""
        if isinstance(values, dict) and "personalize" not in values and values.get("dp", "none") != "none":
            return {**values, "personalize": ["local"]}
        return values

    @model_validator(mode="after")
    def _check(self) -> FedConfig:
        if self.warmup_rounds > self.rounds:
            raise ValueError("warmup_rounds must be <= rounds")
        if self.dp == "none":
            if given := changed_from_default(self, ("dp_noise_multiplier", "dp_clip_norm", "dp_delta")):
                raise ValueError(f"`{given[0]}` applies with dp server or client; with dp none it would be ignored")
        if self.evaluation_split == "validation" and (self.train_fraction >= 1 or self.max_train_questions):
            raise ValueError("evaluation_split = validation needs train_fraction < 1 and no max_train_questions "
                             "(the validation questions are the training questions the run leaves out)")
        if self.dp != "none":
            self._check_dp_sends_no_client_size()
        return self

    def _check_dp_sends_no_client_size(self) -> None:
        """Under DP nothing a client's own data size moves may leave it. Fed-Negative sends one embedding per
        training question (to the server and to the other clients), and per-question validation ranks one per
        question held out of the training log: both are refused."""
        if "fed" in self.personalize:
            raise ValueError("personalize `fed` (Fed-Negative) sends one embedding per training question of a client, "
                             "which gives away its data size: not with dp server or client (use [local] or [])")
        if self.per_query_metrics and self.evaluation_split == "validation":
            raise ValueError("per_query_metrics with evaluation_split = validation sends one rank per held-out "
                             "training question of a client, which gives away its data size: not with dp server "
                             "or client")

    @property
    def evaluation_counts_public(self) -> bool:
        """Whether an evaluation reply carries its client's question count: for the test split always (public: not
        the training log), for the validation split (held out of a client's training log: its count gives away the
        client's training size) without DP only."""
        return self.dp == "none" or self.evaluation_split == "test"

    def to_run_config(self) -> dict[str, bool | float | int | str]:
        """Flower run config: scalars only (lists joined with commas)."""
        out = {}
        for k, v in self.model_dump().items():
            out[k.replace("_", "-")] = ",".join(v) if isinstance(v, list) else v
        return out

    @classmethod
    def from_run_config(cls, cfg: dict) -> FedConfig:
        known = set(cls.model_fields)
        values = {}
        for k, v in cfg.items():
            key = str(k).replace("-", "_")
            if key in known:
                values[key] = [p for p in str(v).split(",") if p] if key == "personalize" else v
        return cls(**values)
