"""How close synthetic queries are to the original ones: corpus BLEU and MAUVE (Carranza et al., section 6.2).

A synthetic BEIR dataset (:func:`privret.synth.generate.generate_synthetic`) is compared with the private split
the generator trained on: a synthetic query for document ``d`` has the original queries of ``d`` as references,
and one without any is left out and counted (``skipped_no_reference``).

* **BLEU** (Papineni et al. 2002; sacrebleu, Post 2018): ``BP exp(sum_{n=1..4} log p_n / 4)``,
  ``BP = min(1, exp(1 - r / c))``, over the pooled corpus; reported divided by 100, the scale of Carranza et al.
* **MAUVE** (Pillutla et al. 2021, ``mauve-text``): P the referenced original queries, Q the evaluated synthetic
  ones, embedded by a local sentence encoder (the *featuriser*, recorded: scores of different featurisers are not
  comparable) and quantised by k-means into histograms ``p``, ``q``; with ``R_l = l p + (1 - l) q``, MAUVE is the
  area under ``{(exp(-c KL(q || R_l)), exp(-c KL(p || R_l)))}``, ``c = 5``.

Privacy: both scores are computed from the private queries and are not covered by the generator's guarantee
(aggregates for the data owner); the output records no query text (docs/audits.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from privret.data.beir import BeirDataset, load_beir
from privret.errors import InputError

SYNTHETIC_SPLIT = "train"
PRIVATE_FIGURES = ("similarity scores of synthetic queries to the private split's queries, and counts of those "
                   "queries, computed without DP")
"""What a similarity result holds of the private data (the warning its JSON starts with)."""
MAUVE_HEADER = "MAUVE vs private queries (not DP)"
MAUVE_NOTE = ("MAUVE vs private queries: MAUVE of the synthetic set against the private log's queries (its train_split, "
              "a seeded subsample of each side; privret.evaluate.similarity). It reads the private log without DP, so "
              "no guarantee covers it: an operator's measurement, like the original-pairs row, kept in the row's "
              "mauve.json and never in a synthetic set, a model or a ledger.")
"""The header and legend of the MAUVE column (the pipeline's summary.md and the report)."""


@dataclass
class Alignment:
    """Synthetic queries (hypotheses) with the original queries of their documents (references)."""

    hypotheses: list[str] = field(default_factory=list)
    references: list[list[str]] = field(default_factory=list)  # one list per hypothesis
    hypothesis_ids: list[str] = field(default_factory=list)
    reference_ids: list[str] = field(default_factory=list)  # unique original query ids used (P)
    skipped_no_reference: int = 0
    synthetic_queries: int = 0


def align(private: BeirDataset, split: str, synthetic: BeirDataset,
          synthetic_split: str = SYNTHETIC_SPLIT) -> Alignment:
    """Pair every synthetic query with the original queries of its document (see module doc)."""
    by_doc: dict[str, list[str]] = {}
    for qid, docs in private.split(split).items():
        for doc_id, rel in docs.items():
            if rel > 0:
                by_doc.setdefault(doc_id, []).append(qid)
    out = Alignment()
    used: dict[str, None] = {}
    for sid, docs in synthetic.split(synthetic_split).items():
        out.synthetic_queries += 1
        refs = list(dict.fromkeys(q for d, rel in docs.items() if rel > 0 for q in by_doc.get(d, [])))
        if not refs:
            out.skipped_no_reference += 1
            continue
        out.hypotheses.append(synthetic.queries[sid])
        out.hypothesis_ids.append(sid)
        out.references.append([private.queries[q] for q in refs])
        used.update(dict.fromkeys(refs))
    out.reference_ids = list(used)
    if not out.hypotheses:
        where = synthetic.root / "qrels" / f"{synthetic_split}.tsv" if synthetic.root else None
        raise InputError(f"no synthetic query has a document with an original query in split '{split}' "
                         "(is this synthetic set generated from that dataset?)", path=where)
    return out


def corpus_bleu(hypotheses: list[str], references: list[list[str]]) -> dict:
    """sacrebleu corpus BLEU with a variable number of references per hypothesis."""
    from sacrebleu.metrics import BLEU

    width = max(len(r) for r in references)
    streams = [[refs[i] if i < len(refs) else None for refs in references] for i in range(width)]
    metric = BLEU()
    result = metric.corpus_score(hypotheses, streams)
    return {"bleu": result.score / 100.0, "score": result.score, "precisions": list(result.precisions),
            "brevity_penalty": result.bp, "hypothesis_length": result.sys_len, "reference_length": result.ref_len,
            "signature": str(metric.get_signature())}


@dataclass
class MauveSettings:
    """The knobs of ``mauve.compute_mauve`` we expose (library defaults otherwise)."""

    num_buckets: int | str = "auto"  # "auto" = max(2, round(min(|P|, |Q|) / 10))
    scaling_factor: float = 5.0
    kmeans_num_redo: int = 5
    kmeans_max_iter: int = 500
    kmeans_explained_var: float = 0.9
    seed: int = 25

    def kwargs(self) -> dict:
        return {"num_buckets": self.num_buckets, "mauve_scaling_factor": self.scaling_factor,
                "kmeans_num_redo": self.kmeans_num_redo, "kmeans_max_iter": self.kmeans_max_iter,
                "kmeans_explained_var": self.kmeans_explained_var, "seed": self.seed}


def featurise(encoder, texts: list[str], *, batch_size: int = 64) -> np.ndarray:
    """L2-normalised sentence embeddings, float32, computed in float32 (no bf16) for reproducibility."""
    from privret.retrieval.embedding import encode

    encoder.eval()
    return encode(encoder, texts, batch_size=batch_size, bf16=False)


def mauve_from_features(p_features: np.ndarray, q_features: np.ndarray, settings: MauveSettings) -> dict:
    import mauve

    result = mauve.compute_mauve(p_features=p_features, q_features=q_features, verbose=False, **settings.kwargs())
    return {"mauve": float(result.mauve), "frontier_integral": float(result.frontier_integral),
            "num_buckets": int(result.num_buckets)}


def _subsample(items: list, limit: int | None, seed: int) -> list:
    if limit is None or len(items) <= limit:
        return items
    return random.Random(seed).sample(items, limit)


def mauve_of_texts(p_texts: list[str], q_texts: list[str], encoder, *, featurizer: str, settings: MauveSettings,
                   max_texts: int | None, seed: int, batch_size: int = 64) -> dict:
    """MAUVE of ``q_texts`` against ``p_texts`` with ``encoder`` (loaded from ``featurizer``), each side first
    subsampled to ``max_texts`` (uniform, ``seed`` for P, ``seed + 1`` for Q); the result records how."""
    from privret.models.registry import resolve

    p_texts = _subsample(p_texts, max_texts, seed)
    q_texts = _subsample(q_texts, max_texts, seed + 1)
    p_feat = featurise(encoder, p_texts, batch_size=batch_size)
    q_feat = featurise(encoder, q_texts, batch_size=batch_size)
    result = mauve_from_features(p_feat, q_feat, settings)
    return {**result, "featurizer": featurizer, "featurizer_location": resolve(featurizer),
            "embedding_dim": int(p_feat.shape[1]), "p_texts": len(p_texts), "q_texts": len(q_texts),
            "settings": settings.kwargs(), "subsample_seed": seed, "max_texts": max_texts}


def evaluate_similarity(private_root: str | Path, split: str, synthetic_root: str | Path, *,
                        featurizer: str = "minilm-l6", mauve: MauveSettings | None = None,
                        max_texts: int | None = None, seed: int = 0, batch_size: int = 64) -> dict:
    """BLEU and MAUVE of one synthetic dataset against the private split (see module doc).

    ``max_texts`` caps |P| and |Q| for MAUVE (uniform subsample with ``seed``); BLEU always uses
    every aligned synthetic query.
    """
    from privret.models.encoder import load_encoder

    settings = mauve or MauveSettings()
    if max_texts is not None and max_texts < 2:
        raise InputError("must be at least 2", field="max_texts")
    private = load_beir(private_root, splits=[split])
    synthetic = load_beir(synthetic_root, splits=[SYNTHETIC_SPLIT])
    aligned = align(private, split, synthetic)
    bleu = corpus_bleu(aligned.hypotheses, aligned.references)

    mauve_result = mauve_of_texts([private.queries[q] for q in aligned.reference_ids], aligned.hypotheses,
                                  load_encoder(featurizer), featurizer=featurizer, settings=settings,
                                  max_texts=max_texts, seed=seed, batch_size=batch_size)

    manifest = _read_manifest(Path(synthetic_root))
    ledger = manifest.get("ledger", {}) if isinstance(manifest, dict) else {}
    epsilon = ledger.get("epsilon")
    return {
        "private": {"root": str(Path(private_root)), "split": split, "queries": len(private.split(split))},
        "synthetic": {"root": str(Path(synthetic_root)), "epsilon": _as_float(epsilon),
                      "delta": _as_float(ledger.get("delta")), "generator": manifest.get("generator"),
                      "base_model": ledger.get("model")},
        "synthetic_queries": aligned.synthetic_queries, "pairs": len(aligned.hypotheses),
        "skipped_no_reference": aligned.skipped_no_reference,
        "bleu": bleu["bleu"], "sacrebleu": bleu,
        "mauve": mauve_result["mauve"], "mauve_details": mauve_result,
    }


def _as_float(value):
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _read_manifest(root: Path) -> dict:
    import json

    path = root / "manifest.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputError(f"malformed JSON ({err.msg})", path=path, line=err.lineno) from None
