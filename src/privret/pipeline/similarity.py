"""MAUVE of every synthetic set of a run against the private log's queries, each a stage (``<row>/mauve.json``,
its record beside it) made once and kept.

P is the queries of ``train_split``, Q the set's queries, each side a uniform seeded subsample of at most
``similarity.max_texts`` (:class:`~privret.settings.pipeline.SimilaritySettings`); features and score as
``privret evaluate similarity`` computes them (:func:`privret.evaluate.similarity.mauve_of_texts`, MAUVE of
Pillutla et al. 2021), with one featuriser loaded for the whole run.

Privacy: it reads the private queries without DP, so no guarantee covers the figure: an operator's measurement,
like the original-pairs row. Its file says so first (:func:`privret.audit.private_output.mark_private`) and lies in
the row's directory, never in a synthetic set, a model or a ledger; nothing the run trains or releases reads it.
"""

from __future__ import annotations

import json

from privret.audit.private_output import mark_private
from privret.data.beir import load_beir
from privret.evaluate.similarity import PRIVATE_FIGURES, SYNTHETIC_SPLIT, MauveSettings, mauve_of_texts
from privret.io import write_json_atomic
from privret.models.encoder import load_encoder
from privret.pipeline.memory import release_memory
from privret.pipeline.rows import Run, console
from privret.pipeline.stages import Stage, write_record

SUMMARY_FIELDS = ("mauve", "featurizer", "max_texts", "private_split")
"""What the summary and the report show of a MAUVE stage (not its counts of private queries)."""


def mauve_stages(run: Run, stages: list[Stage]) -> dict[str, dict]:
    """Each stage's :data:`SUMMARY_FIELDS`, by its row's directory; the stages not done are computed first."""
    missing = [stage for stage in stages if not stage.done.exists()]
    if missing:
        console.rule("MAUVE of each synthetic set against the private queries (not DP)")
        chosen = run.cfg.similarity
        encoder = load_encoder(chosen.featurizer)
        private = [run.dataset.queries[q] for q in run.dataset.split(run.cfg.train_split)]
        for stage in missing:
            (synthetic_stage,) = stage.after
            synthetic = load_beir(synthetic_stage.output, splits=[SYNTHETIC_SPLIT])
            queries = [synthetic.queries[q] for q in synthetic.split(SYNTHETIC_SPLIT)]
            result = mauve_of_texts(private, queries, encoder, featurizer=chosen.featurizer, settings=MauveSettings(),
                                    max_texts=chosen.max_texts, seed=chosen.seed)
            write_record(stage)  # before mauve.json, which marks the stage done
            write_json_atomic(stage.output, mark_private({**result, "private_split": run.cfg.train_split},
                                                         PRIVATE_FIGURES))
        del encoder
        release_memory()
    measured = {}
    for stage in stages:
        result = json.loads(stage.output.read_text(encoding="utf-8"))
        measured[stage.output.parent.name] = {k: result.get(k) for k in SUMMARY_FIELDS}
    return measured
