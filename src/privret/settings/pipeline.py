"""Pipeline configuration (YAML), validated with pydantic.

Relative paths in a config file are resolved against the directory that holds the file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator,
                      model_validator)

from privret.settings.fields import ConfigPath
from privret.data.beir import Document
from privret.data.pairs import PrivacyUnit, examples_from_pairs
from privret.errors import InputError, invalid_input
from privret.io import read_yaml_mapping
from privret.models.device_spec import DeviceSpec
from privret.privacy.budget import DEFAULT_CAP, BudgetPolicy, Cap
from privret.retrieval.index import SearchIndex
from privret.settings.synthesis import DocumentChoice, GenerateConfig, RoundTripFilterConfig
from privret.settings.training import (METHODS, CandidateGrid, DPRetrieverConfig, DPRetrieverSettings, GeneratorSettings,
                                    GeneratorTrainConfig, PrivateSelectionConfig, RetrieverTrainConfig,
                                    SelectionSettings)


class GeneratorStage(GeneratorSettings):
    """Generator settings shared by every epsilon of the grid: each row's epsilon comes from the grid and the unit
    from the config (:meth:`PipelineConfig.generator_config`). A ``hold_out`` is for the DP rows: the non-private
    row trains on the whole log."""

    warm_start: Literal["public-pairs"] | None = Field(
        None, description="start DP fine-tuning from the public-pairs row's generator (public_rows.public_pairs)")


class PublicExample(BaseModel):
    """One public (document, query) pair shown to the prompted generator: the document's text (``doc``), or the
    id of a document of the dataset's public corpus (``doc_id``: its title and text, as the generator reads
    every document), so that a config names a corpus document without copying it. The query must be public
    too (written for the purpose, never taken from the private log)."""

    model_config = ConfigDict(extra="forbid")

    doc: str | None = Field(None, min_length=1, description="the document's text")
    doc_id: str | None = Field(None, min_length=1, description="or the id of a document of the dataset's corpus")
    query: str = Field(min_length=1)

    @model_validator(mode="after")
    def _one_document(self):
        if (self.doc is None) == (self.doc_id is None):
            raise ValueError("give the document's text (doc) or its corpus id (doc_id), one of the two")
        return self


class PublicRows(BaseModel):
    """Rows made without any private data (epsilon = 0; :mod:`privret.train.public`)."""

    model_config = ConfigDict(extra="forbid")

    prompted: bool = Field(False, description="row public-prompted: the untrained generator, few-shot prompted")
    public_pairs: ConfigPath | None = Field(
        None, description="public pairs JSONL ({query, doc}); row public-pairs: the generator fine-tuned on it "
                          "without DP")
    examples: int = Field(3, gt=0, le=32, description="few-shot examples: the first k pairs of public_pairs")
    public_examples: list[PublicExample] = Field(
        default_factory=list, description="few-shot examples given here (used instead of public_pairs')")

    @model_validator(mode="after")
    def _examples_have_a_source(self):
        if self.prompted and not self.public_examples and self.public_pairs is None:
            raise ValueError("public_rows.prompted needs public_rows.public_examples or public_rows.public_pairs")
        return self

    def few_shot(self, corpus: Mapping[str, Document] | None = None) -> list[tuple[str, str]]:
        """The prompted row's examples: ``public_examples`` (a ``doc_id`` read from the public ``corpus``), else
        the first ``examples`` pairs of ``public_pairs``."""
        if not self.public_examples:
            return examples_from_pairs(self.public_pairs, self.examples)
        shots = []
        for i, example in enumerate(self.public_examples):
            if example.doc_id is not None and (corpus is None or example.doc_id not in corpus):
                raise InputError(f"document '{example.doc_id}' is not in the dataset's corpus",
                                 field=f"public_rows.public_examples.{i}.doc_id")
            shots.append((example.doc if example.doc_id is None else corpus[example.doc_id].full_text, example.query))
        return shots


# The fields of a direct DP row that the grid sets, not its settings: where each comes from.
GRID_OWNED = {"method": "direct_dp.methods", "epsilon": "direct_dp.epsilons", "unit": "the config's `unit`"}


class DirectDPGrid(BaseModel):
    """Direct DP training of the retriever on the original pairs: one row per (method, epsilon).

    A method whose settings hold units out (``hold_out``: a public partition of the log, see
    :mod:`privret.privacy.hold_out`) trains on the fit part, and its row is followed by a DP choice on the
    held-out part among the public encoder and the row's retriever interpolated with it (``held_out_choice``).
    The choice spends the row's own epsilon on the other part, so the chosen model costs what the row costs
    (parallel composition, add/remove neighbours). Each row's method and epsilon come from the grid and its unit
    from the config, so ``settings`` and ``per_method`` take neither (:class:`DPRetrieverSettings`)."""

    model_config = ConfigDict(extra="forbid")

    methods: list[str] = Field(default_factory=list, description=f"any of {', '.join(METHODS)}")
    epsilons: list[float] = Field(default_factory=list)
    settings: DPRetrieverSettings = Field(DPRetrieverSettings(), description="settings shared by every row")
    per_method: dict[str, DPRetrieverSettings] = Field(
        default_factory=dict, description="the settings one method's rows set over `settings` (only those given)")
    held_out_choice: CandidateGrid | None = Field(
        None, description="the candidates of the DP choice after each row that holds units out (extra rows "
                          "direct-<method>-eps-<e>-selected, at the row's epsilon on the held-out part); default: "
                          "CandidateGrid's")

    @field_validator("methods")
    @classmethod
    def _known(cls, values: list[str]) -> list[str]:
        for method in values:
            if method not in METHODS:
                raise ValueError(f"unknown direct DP method '{method}' (choose from {', '.join(METHODS)})")
        return values

    @field_validator("settings", "per_method", mode="before")
    @classmethod
    def _no_row_fields(cls, values, info):
        sections = values.values() if info.field_name == "per_method" and isinstance(values, Mapping) else [values]
        for section in sections:
            for field, source in GRID_OWNED.items():
                if isinstance(section, Mapping) and field in section:
                    raise ValueError(f"`{field}` is each row's own: it comes from {source}")
        return values

    @field_serializer("per_method")
    def _only_what_is_set(self, per_method: dict[str, DPRetrieverSettings], info) -> dict[str, dict]:
        """Each method's settings as given, so that a dump read back sets over ``settings`` what it set before."""
        return {m: own.model_dump(mode=info.mode, exclude_unset=True) for m, own in per_method.items()}

    @field_validator("per_method")
    @classmethod
    def _known_keys(cls, values: dict[str, dict]) -> dict[str, dict]:
        cls._known(list(values))
        return values

    @field_validator("epsilons")
    @classmethod
    def _finite_positive(cls, values: list[float]) -> list[float]:
        for eps in values:
            if not math.isfinite(eps) or eps <= 0:
                raise ValueError(f"direct DP epsilons must be finite and > 0, got {eps}")
        return values

    @model_validator(mode="after")
    def _rows_given_whole(self) -> DirectDPGrid:
        if bool(self.methods) != bool(self.epsilons):
            raise ValueError("direct DP rows need both `methods` and `epsilons` (one row per pair); one of them is "
                             "empty")
        unlisted = sorted(set(self.per_method) - set(self.methods))
        if unlisted:
            raise ValueError(f"`per_method` sets '{unlisted[0]}', which is not among `methods`")
        for method, own in self.per_method.items():
            try:
                unused = self.config(method, 1.0, PrivacyUnit.query).unused(own.model_fields_set)
            except ValidationError:  # a setting the method refuses: load_config names it
                continue
            if unused:
                raise ValueError(f"`per_method` gives {method} `{unused[0]}`, which it does not use")
        return self

    @model_validator(mode="after")
    def _choice_has_held_out_units(self) -> DirectDPGrid:
        if self.held_out_choice is not None and not any(self.settings_of(m)["hold_out"] for m in self.methods):
            raise ValueError("`held_out_choice` needs a method whose settings hold units out (`hold_out`)")
        return self

    def section(self, method: str, field: str) -> str:
        """Where ``method``'s ``field`` is set: ``per_method.<method>`` when it sets it, else ``settings``."""
        own = self.per_method.get(method)
        return f"per_method.{method}" if own is not None and field in own.model_fields_set else "settings"

    def settings_of(self, method: str) -> dict:
        """``settings`` with what ``per_method[method]`` sets over it."""
        own = self.per_method.get(method)
        return {**self.settings.model_dump(), **(own.model_dump(exclude_unset=True) if own is not None else {})}

    def config(self, method: str, epsilon: float, unit: PrivacyUnit) -> DPRetrieverConfig:
        return DPRetrieverConfig(**self.settings_of(method), method=method, epsilon=epsilon, unit=unit)

    def held_out_selection(self, method: str, epsilon: float, unit: PrivacyUnit) -> PrivateSelectionConfig | None:
        """The DP choice that follows the row (``method``, ``epsilon``): on the held-out part of its partition, at
        its epsilon, among its public model and the row's retriever (``candidates``, set by the run); None when
        the row holds no units out."""
        trained = self.config(method, epsilon, unit)
        if trained.hold_out is None:
            return None
        return PrivateSelectionConfig(**(self.held_out_choice or CandidateGrid()).model_dump(), epsilon=epsilon,
                                      base=trained.model, unit=unit, hold_out=trained.hold_out)


class BudgetSettings(BaseModel):
    """The run's use of the privacy-budget registry (:mod:`privret.privacy.budget`); the command
    line's ``--budget-cap``, ``--allow-over-budget`` and ``--dataset-name`` override it."""

    model_config = ConfigDict(extra="forbid")

    cap: Cap = Field(DEFAULT_CAP, description="total epsilon of all DP releases on the dataset")
    allow_over: bool = Field(False, description="run past the cap (or at a second privacy unit) with a warning; "
                                                "for grids of alternatives that are never released together")
    dataset_name: str = Field("", description="charge the releases to this name, not to the content of the "
                                              "private pairs")

    def policy(self) -> BudgetPolicy:
        return BudgetPolicy(cap=self.cap, allow_over=self.allow_over)


class SimilaritySettings(BaseModel):
    """MAUVE of every synthetic set of the run against the private log's queries (``train_split``), each side a
    uniform seeded subsample of at most ``max_texts``: an operator's measurement, read without DP."""

    model_config = ConfigDict(extra="forbid")

    mauve: bool = Field(True, description="compute it (rows <row>/mauve.json; not DP, never released)")
    max_texts: int = Field(1000, ge=2, description="texts per side (synthetic, private), subsampled with `seed`")
    seed: int = Field(0, ge=0, description="the subsample's seed")
    featurizer: str = Field("minilm-l6", min_length=1, description="the sentence encoder of MAUVE's features")


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                      description="run name; the default run directory is runs/<name>, so one plain path component")
    dataset: ConfigPath
    train_split: str = "train"
    eval_split: str = "test"
    unit: PrivacyUnit = PrivacyUnit.query
    settings_chosen_on: str | None = Field(
        None, description="the dataset's split on which this config's settings were chosen (for example validation); "
                          "the run is refused when that split is missing or shares a query with train_split: "
                          "settings chosen on a split are trained without it")
    epsilons: list[float] = Field(min_length=1)
    synthetic_documents: DocumentChoice = Field(
        DocumentChoice(), description="the documents to write queries for: public (corpus, list) or DP-selected")
    generator: GeneratorStage = GeneratorStage()
    generate: GenerateConfig = GenerateConfig()
    retriever: RetrieverTrainConfig = RetrieverTrainConfig()
    direct_dp: DirectDPGrid = DirectDPGrid()
    synthetic_filter: RoundTripFilterConfig | None = Field(
        None, description="also train on the round-trip-filtered synthetic set (extra rows eps-<e>-filtered)")
    public_rows: PublicRows = Field(PublicRows(), description="rows without private data (epsilon = 0)")
    private_selection: SelectionSettings | None = Field(
        None, description="also choose, with DP on the private log, among the public encoder, each DP synthetic row's "
                          "retrievers and their interpolations (extra rows eps-<e>-selected; their ledgers add "
                          "this epsilon)")
    budget: BudgetSettings = BudgetSettings()
    similarity: SimilaritySettings = Field(SimilaritySettings(), description="MAUVE of each synthetic set against the "
                                                                             "private queries (not DP)")
    search: SearchIndex = Field(SearchIndex(), description="the FAISS index every evaluation searches: exact "
                                                            "(default), hnsw or ivf (privret.retrieval.index)")
    device: DeviceSpec = Field("auto", description="where models run: auto (CUDA when available, else CPU), cpu, "
                                                    "cuda or cuda:N (privret.models.device); the command line's "
                                                    "--device overrides it")

    @field_validator("epsilons")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        for eps in values:
            if math.isnan(eps) or eps <= 0:
                raise ValueError(f"every epsilon must be > 0 or inf, got {eps}")
        return values

    @model_validator(mode="after")
    def _public_rows_are_public(self):
        if self.generator.warm_start == "public-pairs" and self.public_rows.public_pairs is None:
            raise ValueError("generator.warm_start: public-pairs needs public_rows.public_pairs")
        if self.eval_split == self.train_split:
            raise ValueError(f"eval_split is the private log ({self.train_split}): its figures, per query, would be "
                             "written beside DP rows without any guarantee; evaluate on another split")
        if self.settings_chosen_on in (self.train_split, self.eval_split):
            role = "the private log" if self.settings_chosen_on == self.train_split else "the evaluation split"
            raise ValueError(f"settings_chosen_on is {role} ({self.settings_chosen_on}): choose settings on a split "
                             "that is neither trained on nor reported")
        if self.generator.hold_out is not None and self.private_selection is None:
            raise ValueError("generator.hold_out needs private_selection: the held-out units serve only the DP choice "
                             "of the retriever, so without it the generator would train on part of the log for nothing")
        rows = self.public_rows
        if (rows.prompted or rows.public_pairs is not None) and self.synthetic_documents.source == "dp-select":
            raise ValueError("public_rows need public documents: with synthetic_documents dp-select their documents "
                             "would come from the private log (use corpus or list)")
        return self

    def generator_config(self, epsilon: float) -> GeneratorTrainConfig:
        """The generator of the row at ``epsilon``; a non-private one (epsilon inf) trains on the whole log."""
        dropped = {"warm_start"} | (set() if math.isfinite(epsilon) else {"hold_out"})
        return GeneratorTrainConfig(**{**self.generator.model_dump(exclude=dropped), "epsilon": epsilon,
                                       "unit": self.unit})


def load_config(path: str | Path) -> PipelineConfig:
    path = Path(path)
    raw = read_yaml_mapping(path)
    try:
        config = PipelineConfig.model_validate(raw)
    except ValidationError as err:
        raise invalid_input(err, path=path) from None
    grid = config.direct_dp
    for method in grid.methods:  # settings that need the method are checked now, not hours into the run
        try:
            grid.config(method, (grid.epsilons or [1.0])[0], config.unit)
        except ValidationError as err:
            raise invalid_input(err, path=path, under="direct_dp", what=f"method {method}") from None
    config.dataset = _beside(path, config.dataset)
    if config.public_rows.public_pairs is not None:
        config.public_rows.public_pairs = _beside(path, config.public_rows.public_pairs)
    if config.synthetic_documents.ids_file is not None:
        config.synthetic_documents.ids_file = _beside(path, config.synthetic_documents.ids_file)
    return config


def _beside(config_path: Path, value: Path) -> Path:
    """``value`` as written, or resolved against the config's folder when relative (a NUL byte was refused by its
    type, :data:`~privret.settings.fields.ConfigPath`)."""
    return value if value.is_absolute() else (config_path.parent / value).resolve()
