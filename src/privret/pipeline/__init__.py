"""The whole grid in one run directory: zero-shot, original pairs, and DP synthetic per epsilon.

:mod:`~privret.pipeline.stages` plans the stages (name, "done" file, fingerprint of their settings)
and checks finished ones against the config; :mod:`~privret.pipeline.run` makes what is not done;
:mod:`~privret.pipeline.summary` writes the summary and the run's joint privacy cost;
:mod:`~privret.run_layout` names what is where.

Layout of ``RUN_DIR``::

    zero_shot/metrics.json
    documents/documents.txt        (the documents to write queries for; with dp-select, its ledger beside it)
    original/retriever/            (SentenceTransformer + ledger: non-private)
    original/metrics.json
    public-prompted/               (with ``public_rows.prompted``: no private data, epsilon 0; the untrained
                                    generator with public few-shot examples; generator/, synthetic/, retriever/,
                                    metrics.json as for eps-<e>)
    public-pairs/                  (with ``public_rows.public_pairs``: no private data, epsilon 0; the generator
                                    fine-tuned without DP on the public pairs; same layout)
    eps-<e>/generator/             (fine-tuned generator + privacy ledger; with ``generator.warm_start:
                                    public-pairs``, started from public-pairs/generator)
    eps-<e>/synthetic/             (BEIR dataset + manifest carrying the ledger)
    eps-<e>/retriever/
    eps-<e>/metrics.json
    eps-<e>-filtered/synthetic/    (with ``synthetic_filter``: the round-trip-filtered set, same ledger)
    eps-<e>-filtered/retriever/, eps-<e>-filtered/metrics.json
    direct-<method>-eps-<e>/retriever/   (direct DP training on the original pairs, with its ledger)
    direct-<method>-eps-<e>/metrics.json
    <row>/per_query.json           (beside each metrics.json: each test query's metrics, for the CI)
    <stage output>/stage.json, <row>/metrics.stage.json   (each stage's fingerprint)
    summary.json, summary.md       (Table 3 layout of Carranza et al., with retention and the CI against zero-shot)
    budget.json                    (what releasing every DP model of the run together costs)
    cache/embeddings/<key>.npy     (the public zero-shot encoder's corpus embeddings)
"""
