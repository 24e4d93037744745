"""Evaluating one pipeline stage's retriever on the evaluation split (:func:`evaluate_stage`), unless done.

**Embedding cache.** The zero-shot evaluation and the round-trip filter (once per epsilon) encode
the same public corpus, with the same public encoder when ``synthetic_filter.encoder`` is the
zero-shot model; the matrix is computed once and reused from ``cache/embeddings``
(:func:`privret.retrieval.embedding.corpus_embeddings`; keyed by the encoder's exact weights and the
corpus texts, so a changed model or corpus never reads a stale entry). Only public encoders are
cached: retrievers trained on the private pairs or on synthetic sets are each evaluated once, and
their embeddings are never written there.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from privret.data.beir import BeirDataset
from privret.evaluate.statistics import PER_QUERY_FILE
from privret.io import write_json_atomic
from privret.models.device import precision_label
from privret.models.encoder import load_encoder
from privret.models.model_card import record_evaluation
from privret.pipeline.memory import release_memory
from privret.pipeline.stages import Stage, write_record
from privret.retrieval.metrics import evaluate_per_query, mean_metrics


def evaluate_stage(stage: Stage, model_name: str, dataset: BeirDataset, split: str, extra: dict, *,
                   search=None, cache_dir: Path | None = None) -> dict:
    """Metrics of a retriever searched with ``search`` (default exact), unless done; ``cache_dir`` only for a public
    encoder (privacy).

    Writes the means to ``metrics.json`` and, first, each query's metrics to ``per_query.json`` beside it.
    The row returned adds ``stage`` (the directory) and ``per_query`` (NDCG@10 per query id; None for a
    stage evaluated by an older privret, without ``per_query.json``) for the summary's statistics.
    """
    path = stage.output
    per_query_path = path.with_name(PER_QUERY_FILE)
    if path.exists():
        result = json.loads(path.read_text())
        per_query = json.loads(per_query_path.read_text()) if per_query_path.exists() else None
    else:
        started = time.time()
        model = load_encoder(model_name)
        precision = precision_label(model.device)
        per_query = evaluate_per_query(model, dataset.corpus, dataset.queries, dataset.split(split),
                                       cache_dir=cache_dir, index=search)
        del model
        result = {**extra, **mean_metrics(per_query), "precision": precision,
                  "eval_seconds": round(time.time() - started, 1)}
        write_json_atomic(per_query_path, per_query)  # before metrics.json, which marks the stage done
        record_evaluation(model_name, data=dataset.root.name if dataset.root else "data", split=split,
                          metrics=mean_metrics(per_query), precision=precision)
        write_record(stage)  # before metrics.json too: a finished evaluation always has its record
        write_json_atomic(path, result)
        release_memory()
    ndcg = None if per_query is None else {q: v["ndcg@10"] for q, v in per_query.items()}
    return {**result, "stage": path.parent.name, "per_query": ndcg}
