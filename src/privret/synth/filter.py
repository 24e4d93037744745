"""Round-trip consistency filter for synthetic queries, with a public encoder.

A synthetic pair (q, d) is kept when a *public* encoder, searching the public corpus with q, ranks d in its top
``top_k`` (Alberti et al. 2019, "Synthetic QA corpora generation with roundtrip consistency"; Dai et al. 2022,
"Promptagator"): it removes degenerate outputs that teach a retriever nothing or something wrong.

Privacy: the filter reads only the synthetic set (the DP release), the public corpus and a public encoder, so the
kept set is post-processing and carries the set's ledger unchanged (Dwork and Roth 2014, Prop. 2.1). An encoder
trained by privret on the private data (a ledger that is not a public, epsilon-0 one) is refused. With a
``cache_dir`` the public encoder's embeddings of the public corpus are kept and reused
(:func:`privret.retrieval.embedding.corpus_embeddings`); they hold nothing derived from private data.
"""

from __future__ import annotations

from pathlib import Path


from privret.data.beir import BeirDataset, Document, load_beir, write_beir
from privret.errors import InputError
from privret.retrieval.search import search
from privret.io import atomic_path
from privret.models.encoder import load_encoder
from privret.privacy.ledger import PrivacyLedger, require_public
from privret.settings.synthesis import RoundTripFilterConfig


def filter_round_trip(synthetic_dir: str | Path, corpus: dict[str, Document], out_dir: str | Path,
                      cfg: RoundTripFilterConfig, *, cache_dir: str | Path | None = None) -> dict:
    """Write the kept pairs of ``synthetic_dir`` (a BEIR ``train`` split) to ``out_dir``; its manifest.

    ``corpus`` is the public corpus searched; every synthetic document must be in it. ``cache_dir``:
    where the public encoder's corpus embeddings are reused or stored (none: encode every time).
    """
    synthetic_dir, out_dir = Path(synthetic_dir), Path(out_dir)
    require_public(cfg.encoder, field="encoder", use="the round-trip filter (post-processing)")
    ledger = PrivacyLedger.load(synthetic_dir)
    synthetic = load_beir(synthetic_dir, splits=["train"])
    missing = sorted(set(synthetic.corpus) - set(corpus))
    if missing:
        raise InputError(f"{len(missing)} synthetic documents are not in the corpus searched (first: {missing[0]})",
                         path=synthetic_dir / "corpus.jsonl", field="_id")
    model = load_encoder(cfg.encoder)
    run = search(model, corpus, synthetic.queries, k=cfg.top_k, batch_size=cfg.batch_size, cache_dir=cache_dir)
    qrels = synthetic.split("train")
    kept = {q: docs for q, docs in qrels.items() if any(d in run.get(q, {}) for d in docs)}
    used = {d for docs in kept.values() for d in docs}
    manifest = {"source": str(synthetic_dir), "ledger": ledger.model_dump(mode="json"),
                "filter": {"kind": "round-trip", **cfg.model_dump(mode="json")},
                "queries_in": len(qrels), "kept": len(kept), "removed": len(qrels) - len(kept)}
    filtered = BeirDataset(corpus={d: doc for d, doc in synthetic.corpus.items() if d in used},
                           queries={q: synthetic.queries[q] for q in kept}, qrels={"train": kept})
    with atomic_path(out_dir) as staged:  # dataset and ledger appear together
        write_beir(staged, filtered, manifest=manifest)
        ledger.save(staged)
    return manifest
