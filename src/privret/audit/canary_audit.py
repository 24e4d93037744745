"""The canary exposure audit of the DP query generator: train with canaries inserted at each epsilon
(:func:`privret.train.generator.train_generator`), score the secrets, and summarise (:mod:`privret.audit.canaries`
builds the canaries, :mod:`privret.audit.canary_scoring` scores them, :mod:`privret.audit.canary_statistics`
turns ranks into exposure and an epsilon lower bound).

Units: a canary inserted ``k`` times with one query text is **one** unit under the default unit ``query`` (its
``k`` row gradients are clipped together), so the ledger's (epsilon, delta) covers it whole and the bound is
comparable to the ledger's epsilon. Under ``unit = pair`` it is a group of ``k`` units, protected only by group
privacy, ``(k eps, k e^{(k-1) eps} delta)``: not comparable for ``k > 1`` (``comparable_to_ledger`` says which).
See docs/audits-canaries.md, section "Privacy units: what the audit measures".
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from privret.audit.canaries import KINDS, Canary, insert_canaries, make_canaries, subsample_pairs
from privret.audit.canary_scoring import fast_log_likelihoods
from privret.audit.canary_statistics import exposure, secret_rank, summarise
from privret.audit.private_output import mark_private, refuse_run_directory
from privret.data.pairs import PrivacyUnit, TrainingPairs
from privret.errors import InputError
from privret.io import PRIVATE_DATA_KEY, write_json_atomic
from privret.models.generator import load_trained_generator
from privret.privacy import budget as budget_registry
from privret.privacy.accounting import default_delta
from privret.privacy.commitment import commit
from privret.privacy.ledger import PrivacyLedger
from privret.progress import Progress
from privret.train.generator import train_generator
from privret.settings.training import GeneratorSettings, GeneratorTrainConfig


def eps_label(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def _digits(text: str) -> str:
    return re.sub(r"\s+", "", text)


class CanaryAuditConfig(BaseModel):
    """Settings of one audit: the canaries, the generator's fine-tune (each epsilon of ``epsilons`` in turn; trial
    ``t`` trains with seed ``generator.seed + t``) and the privacy unit the canaries are counted in."""

    model_config = ConfigDict(extra="forbid")

    epsilons: list[float] = Field(default_factory=lambda: [math.inf, 16.0], min_length=1)
    trials: int = Field(3, gt=0)
    repetitions: list[int] = Field(default_factory=lambda: [1, 10, 100], min_length=1)
    candidates: int = Field(100, ge=2, le=100_000)
    samples: int = Field(10, gt=0, description="queries sampled per canary document for 'leaked'")
    top_p: float = Field(0.8, gt=0, le=1, description="nucleus sampling for 'leaked', with no repetition penalty: "
                                                      "the synthesis default's penalty would hold back a secret's "
                                                      "repeated digits, so the audit samples without it")
    subsample: int | None = Field(None, gt=0, description="private pairs kept (uniform, seeded); None = all")
    alpha: float = Field(0.05, gt=0, lt=1, description="confidence of the epsilon lower bound is 1 - alpha")
    seed: int = 0
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)
    unit: PrivacyUnit = Field(PrivacyUnit.query, description="query: a canary is one unit; pair: k units")

    def generator_config(self, epsilon: float, trial: int = 0) -> GeneratorTrainConfig:
        """The fine-tune of ``trial`` at ``epsilon``."""
        return GeneratorTrainConfig(**{**self.generator.model_dump(), "seed": self.generator.seed + trial},
                                    unit=self.unit, epsilon=epsilon)

    @field_validator("epsilons")
    @classmethod
    def _eps(cls, values):
        for e in values:
            if math.isnan(e) or e <= 0:
                raise ValueError(f"every epsilon must be > 0 or inf, got {e}")
        return values

    @field_validator("repetitions")
    @classmethod
    def _reps(cls, values):
        if any(k <= 0 for k in values) or len(set(values)) != len(values):
            raise ValueError("repetitions must be distinct positive integers")
        return sorted(values)


SETTINGS_HOLD = "the private log's pair count"
RESULTS_HOLD = ("per canary, the id of the private query it was drawn from, that query's relevant document for "
                "own-document canaries (a private pair) and the likelihood of the query with the secret; the private "
                "log's pair count")


def audit_settings(cfg: CanaryAuditConfig, data_hash: str, n_pairs: int) -> dict:
    """What an audit directory's ``settings.json`` holds: a re-run must match it (epsilons aside; they are checked
    trial by trial, so that more can be added later). The data is named as ledgers name it (a commitment)."""
    return json.loads(json.dumps(mark_private({
        "audit": cfg.model_dump(mode="json", exclude={"epsilons", "generator", "unit"}),
        "generator": cfg.generator_config(math.inf).model_dump(mode="json"), "data_hash": commit(data_hash),
        "pairs": n_pairs}, SETTINGS_HOLD)))


def same_settings(saved: dict, settings: dict) -> bool:
    """Does an audit directory's ``settings.json`` (``saved``) hold the audit of ``settings``?

    Audits written by a privret older than the typed generator settings also kept the generator's fields as
    given under ``audit`` (``audit.generator``, a partial dict with the unit); the resolved ``generator`` entry, which
    both kinds hold, says the same in full, so that partial copy is not compared. Nor is the private-data warning,
    which older audits lack."""
    saved = {**saved, "audit": {k: v for k, v in saved.get("audit", {}).items() if k != "generator"}}
    return _unmarked(saved) == _unmarked(settings)


def _unmarked(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k != PRIVATE_DATA_KEY}


def _query_fits(model: str, max_query_tokens: int):
    """``query -> bool``: does the query (with its end-of-query token) fit the generator's target cap?"""
    from transformers import AutoTokenizer

    from privret.models.registry import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve(model))
    return lambda query: len(tokenizer(" " + query, add_special_tokens=False).input_ids) + 1 <= max_query_tokens


def _trial_result(generator, canaries: list[Canary], cfg: CanaryAuditConfig) -> list[dict]:
    rows = []
    docs = [c.document.full_text for c in canaries]
    samples: list[list[str]] = []
    # long enough for any query the generator was trained to write (its target cap + end of query)
    max_new = generator.max_query_tokens + 1
    for lo in range(0, len(docs), 8):
        samples += generator.generate(docs[lo: lo + 8], num_queries=cfg.samples, top_p=cfg.top_p,
                                      max_new_tokens=max_new,
                                      seed=cfg.seed * 7919 + canaries[0].trial * 101 + lo)
    for c, sampled in zip(canaries, samples):
        scores = fast_log_likelihoods(generator, c.document.full_text, [c.query(s) for s in c.candidates])
        index = c.candidates.index(c.secret)
        rank = secret_rank(scores, index)
        rows.append({"trial": c.trial, "kind": c.kind, "repetitions": c.repetitions, "secret": c.secret,
                     "document_id": c.document.id, "source_query_id": c.source_query_id,
                     "log_likelihood": scores[index], "rank": rank, "exposure": exposure(rank, len(scores)),
                     "leaked": any(c.secret in _digits(q) for q in sampled), "samples": len(sampled)})
    return rows


def run_canary_audit(pairs: TrainingPairs, out_dir: str | Path, cfg: CanaryAuditConfig, *,
                     data_hash: str, dataset_id: str = "", budget: budget_registry.BudgetPolicy | None = None,
                     allow_private_output_in_run: bool = False) -> dict:
    """Run every (epsilon, trial), write ``out_dir/canaries.json`` and return it.

    Each trial's generator and raw result sit in ``out_dir/eps-<e>/trial-<t>/``; a re-run skips
    trials whose ``result.json`` exists (same settings required, epsilons aside: they are checked, so
    more epsilons can be added to an audit later). Every DP trial is a release on the audited data:
    it is charged to ``dataset_id`` (default: that of ``pairs``, before subsampling and canaries)
    under the budget policy ``budget`` (:mod:`privret.privacy.budget`).

    What it writes holds private data (:data:`RESULTS_HOLD`; each JSON file says so first): an ``out_dir`` inside a
    pipeline run directory, whose report is meant to be shared, is refused unless ``allow_private_output_in_run``.
    """
    refuse_run_directory(out_dir, allowed=allow_private_output_in_run)
    out_dir = Path(out_dir)
    dataset_id = dataset_id or budget_registry.dataset_id(pairs)
    base = subsample_pairs(pairs, cfg.subsample, cfg.seed)
    settings = audit_settings(cfg, data_hash, len(base.pairs))
    settings_file = out_dir / "settings.json"
    if settings_file.exists():
        if not same_settings(json.loads(settings_file.read_text()), settings):
            raise InputError("holds an audit with other settings; choose another output directory", path=out_dir)
    fits = _query_fits(cfg.generator.model, cfg.generator.max_query_tokens)  # a model that cannot load: nothing written
    if not settings_file.exists():
        write_json_atomic(settings_file, settings)

    results = []
    trials = {t: make_canaries(base, trial=t, repetitions=tuple(cfg.repetitions), n_candidates=cfg.candidates,
                               seed=cfg.seed, fits=fits) for t in range(cfg.trials)}
    with Progress() as progress:
        task = progress.add_task("canary audit (trials x epsilons)", total=cfg.trials * len(cfg.epsilons))
        for epsilon in cfg.epsilons:
            canary_rows: list[dict] = []
            ledgers = []
            for t, canaries in trials.items():
                trial_dir = out_dir / f"eps-{eps_label(epsilon)}" / f"trial-{t}"
                result_file = trial_dir / "result.json"
                if not result_file.exists():
                    training = insert_canaries(base, canaries)
                    gen_cfg = cfg.generator_config(epsilon, trial=t)
                    if not (trial_dir / "generator" / "generator.json").exists():
                        train_generator(training, trial_dir / "generator", gen_cfg, data_hash=data_hash,
                                        dataset_id=dataset_id, resume=True, budget=budget)
                    generator = load_trained_generator(trial_dir / "generator")
                    rows = _trial_result(generator, canaries, cfg)
                    ledger = PrivacyLedger.load(trial_dir / "generator")
                    write_json_atomic(result_file, mark_private({"ledger": ledger.model_dump(mode="json"),
                                                                 "canaries": rows}, RESULTS_HOLD))
                saved = json.loads(result_file.read_text())
                canary_rows += saved["canaries"]
                ledgers.append(saved["ledger"])
                progress.advance(task)
            ledger = ledgers[0]
            delta = ledger["delta"] if ledger["delta"] else default_delta(ledger["n_units"])
            results.append({"epsilon": eps_label(epsilon), "epsilon_spent": ledger["epsilon"], "delta": delta,
                            "unit": ledger["unit"], "n_units": ledger["n_units"], "ledger": ledger,
                            "rows": summarise(canary_rows, n_candidates=cfg.candidates, delta=delta,
                                              unit=ledger["unit"], alpha=cfg.alpha),
                            "canaries": canary_rows})
    report = mark_private({"audit": "canary-exposure", "candidates": cfg.candidates, "kinds": list(KINDS),
                           "trials": cfg.trials, "repetitions": cfg.repetitions, "samples": cfg.samples,
                           "alpha": cfg.alpha, "subsample": cfg.subsample, "pairs": len(base.pairs),
                           "pairs_available": len(pairs.pairs),
                           "generator": {k: v for k, v in settings["generator"].items() if k != "epsilon"},
                           "results": results}, RESULTS_HOLD)
    write_json_atomic(out_dir / "canaries.json", report)
    return report


def canary_table_markdown(report: dict) -> str:
    """The Table 7 layout of Carranza et al., one line per (epsilon, repetitions)."""
    lines = ["| epsilon | repetitions | canaries | rank (mean ± sd) | exposure (bits) | extracted | leaked "
             "| epsilon lower bound |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    m = report["candidates"]
    for res in report["results"]:
        for r in res["rows"]:
            bound = "-" if r["epsilon_lower_bound"] is None else f"{r['epsilon_lower_bound']:.3g}"
            if r["epsilon_lower_bound"] is not None and not r["comparable_to_ledger"]:
                bound += " (group)"
            k = "0 (control)" if r["repetitions"] == 0 else str(r["repetitions"])
            lines.append(f"| {res['epsilon']} | {k} | {r['canaries']} "
                         f"| {r['rank_mean']:.1f}/{m} ± {r['rank_std']:.1f} "
                         f"| {r['exposure_mean']:.2f} ± {r['exposure_std']:.2f} | {r['extracted_fraction']:.0%} "
                         f"| {r['leaked_fraction']:.0%} | {bound} |")
    return "\n".join(lines) + "\n"
