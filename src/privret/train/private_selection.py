"""Choose a retriever with the private log, under DP: zero-shot, fine-tuned, or in between.

1. The candidates: the public ``base`` encoder, each fine-tuned retriever in ``candidates``, and its weight-space
   interpolations with the base at ``weights`` (:func:`privret.models.wise_ft.interpolate`).
2. Each privacy unit of the log (with ``hold_out``, of its held-out part: :mod:`privret.privacy.hold_out`) scores
   each candidate by the mean NDCG@10, in [0, 1], of its queries (one per distinct query text, its documents
   relevant) over the *public* corpus (documents given inline with private pairs left out): a function of that
   unit's rows alone.
3. The exponential mechanism draws the choice (:mod:`privret.privacy.private_selection`), recorded in the budget
   registry before step 2.
4. The chosen model is written with a ledger that composes the choice with every distinct ledger of the
   candidates (in parallel with a candidate trained on the fit part of the same partition),
   ``private_selection.json`` (candidates and choice, never the scores, which are not DP) and a model card.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from privret.data.pairs import TrainingPairs
from privret.errors import InputError
from privret.io import atomic_path, write_json_atomic
from privret.models.encoder import load_encoder
from privret.models.wise_ft import load_interpolated
from privret.models.model_card import write_model_card
from privret.privacy import budget as budget_registry
from privret.privacy import private_selection as mechanism
from privret.privacy.ledger import PrivacyLedger, has_ledger, require_public
from privret.privacy.hold_out import HELDOUT
from privret.retrieval.metrics import per_query_metrics
from privret.retrieval.search import search
from privret.runlock import RunLock
from privret.settings.training import PrivateSelectionConfig

SELECTION_FILE = "private_selection.json"


@dataclass(frozen=True)
class Candidate:
    """``source`` interpolated with the base at ``weight`` (``source`` None: the base itself)."""

    source: str | None
    weight: float

    @property
    def name(self) -> str:
        if self.source is None:
            return "base"
        return self.source if self.weight == 1.0 else f"{self.source}@{self.weight:g}"


def build_candidates(cfg: PrivateSelectionConfig) -> list[Candidate]:
    """The base first, then each of ``cfg.candidates`` at each of ``cfg.weights``."""
    return [Candidate(None, 0.0)] + [Candidate(str(c), w) for c in cfg.candidates for w in cfg.weights]


def materialise(candidate: Candidate, cfg: PrivateSelectionConfig, *, base=None):
    """The candidate as a SentenceTransformer (``base``: the loaded base model, to skip loading it again)."""
    return load_interpolated(candidate.source, candidate.weight, base=cfg.base, max_seq_length=cfg.max_seq_length,
                             base_model=base)


def unit_queries(pairs: TrainingPairs, unit) -> tuple[dict[str, str], dict[str, dict[str, int]], list[list[str]]]:
    """The queries each unit asks: ids ``<unit>:<k>``, one per distinct query text of the unit (its documents
    relevant); returns (texts, qrels, the query ids of each unit)."""
    texts, qrels, per_unit = {}, {}, []
    for u, rows in enumerate(pairs.units(unit)):
        docs: dict[str, set[str]] = defaultdict(set)
        for i in rows:
            docs[pairs.pairs[i].query].add(pairs.pairs[i].doc_id)
        ids = []
        for k, (text, relevant) in enumerate(docs.items()):
            qid = f"{u}:{k}"
            texts[qid], qrels[qid] = text, {d: 1 for d in relevant}
            ids.append(qid)
        per_unit.append(ids)
    return texts, qrels, per_unit


def public_corpus(pairs: TrainingPairs) -> dict:
    """The documents the units' queries search: the pairs' corpus without the documents that came inline with
    private pairs (those are private; with them, one unit's document could change another unit's score)."""
    return {d: doc for d, doc in pairs.corpus.items() if d not in pairs.inline_doc_ids}


def unit_scores(model, pairs: TrainingPairs, unit, corpus: dict) -> np.ndarray:
    """Each unit's mean NDCG@10 over its queries, searching ``corpus`` (public) with ``model``."""
    texts, qrels, per_unit = unit_queries(pairs, unit)
    distinct = {text: f"t{i}" for i, text in enumerate(dict.fromkeys(texts.values()))}
    run_by_text = search(model, corpus, {tid: text for text, tid in distinct.items()}, k=10)
    run = {qid: run_by_text[distinct[text]] for qid, text in texts.items()}
    ndcg = {qid: m["ndcg@10"] for qid, m in per_query_metrics(run, qrels).items()}
    return np.array([np.mean([ndcg.get(q, 0.0) for q in ids]) for ids in per_unit])


def composed_ledger(candidates: list[Candidate], selection: PrivacyLedger) -> PrivacyLedger:
    """The selection composed with every distinct ledger among the candidates' sources (copies of one
    ledger, e.g. two retrievers trained on one synthetic set, count once: copies carry the stamp of the release
    they copy; an unstamped ledger, written before stamps, counts once per file, as unstamped parts do in
    :func:`privret.privacy.ledger_composition.compose_ledgers`); sources without one, or with a public epsilon-0
    one, read no private data and add nothing (their ledgers would only make the composed one describe public data
    in its first part)."""
    seen: dict[str, PrivacyLedger] = {}
    for c in candidates:
        if c.source is not None and has_ledger(c.source):
            ledger = PrivacyLedger.load(c.source)
            if not ledger.is_public:
                seen.setdefault(ledger.model_dump_json() if ledger.created_at else str(Path(c.source).resolve()),
                                ledger)
    ledgers = list(seen.values())
    return ledgers[0].compose(*ledgers[1:], selection) if ledgers else selection


def select_retriever(pairs: TrainingPairs, out_dir: str | Path, cfg: PrivateSelectionConfig, *, data_hash: str,
                     dataset_id: str, budget=None) -> dict:
    """Score the candidates on ``pairs`` (the private log), choose one with epsilon-DP, save it to ``out_dir``.

    ``cfg.hold_out``: score on that partition's held-out part only. Candidates trained with DP on its fit part
    (``retriever train-dp`` with the same partition) then compose with the choice in parallel: the chosen
    model's ledger costs the larger of the two epsilons, not their sum (:mod:`privret.privacy.hold_out`).

    Returns the record written to ``private_selection.json``. The release is recorded in the budget
    registry (``budget``: a :class:`~privret.privacy.budget.BudgetPolicy`) first, so a run past the cap is
    refused before any work, and a crash later counts the release without a model (conservative).
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise InputError("already exists (remove it or choose another output)", path=out_dir)
    if not cfg.candidates:
        raise InputError("give at least one fine-tuned retriever to choose from", field="candidates")
    require_public(cfg.base, field="base", use="a DP choice (the base is a candidate whose ledger is not composed)")
    candidates = build_candidates(cfg)
    part = None if cfg.hold_out is None else cfg.hold_out.part(HELDOUT)
    scored = pairs if part is None else part.take(pairs, cfg.unit)
    units = scored.units(cfg.unit)
    selection = mechanism.selection_ledger(epsilon=cfg.epsilon, n_units=len(units), unit=cfg.unit.value,
                                           n_pairs=len(scored.pairs), data_hash=data_hash, dataset_id=dataset_id,
                                           part=part)
    ledger = composed_ledger(candidates, selection)  # refuses candidates of another privacy unit, early
    corpus = public_corpus(pairs)
    if not corpus:
        raise InputError("the units' queries search a public corpus, and there is none: give the BEIR dataset "
                         "whose corpus the pairs point at", field="data")
    with RunLock(out_dir, what="retriever directory"):
        budget_registry.check_and_record(budget_registry.Release.from_ledger(
            selection, release_id=budget_registry.new_release_id(), status="final", artefact=out_dir.absolute()),
            budget)
        base = load_encoder(cfg.base, max_seq_length=cfg.max_seq_length)
        scores = np.stack([unit_scores(materialise(c, cfg, base=base), scored, cfg.unit, corpus)
                           for c in candidates], axis=1)
        chosen = candidates[mechanism.choose(scores, cfg.epsilon)]
        record = {"mechanism": mechanism.MECHANISM, "epsilon": cfg.epsilon, "unit": cfg.unit.value,
                  "n_units": len(units), "part": None if part is None else part.model_dump(), "base": cfg.base, "candidates": [c.name for c in candidates],
                  "chosen": chosen.name, "chosen_source": chosen.source or cfg.base, "chosen_weight": chosen.weight}
        with atomic_path(out_dir) as staged:
            materialise(chosen, cfg, base=base).save(str(staged), safe_serialization=True)
            ledger.save(staged)
            write_json_atomic(staged / SELECTION_FILE, record)
            write_model_card(staged)
    return record
