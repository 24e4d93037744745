"""The whole grid in one run directory: zero-shot, original pairs, DP synthetic rows per epsilon, direct DP rows.

:mod:`~privret.pipeline.stages` plans the stages and checks finished ones against the config;
:mod:`~privret.pipeline.run` makes what is not done; :mod:`~privret.pipeline.summary` writes the summary and the
run's joint privacy cost; :mod:`~privret.run_layout` names what is where. Layout of ``RUN_DIR``::

    zero_shot/, original/retriever/                 zero-shot and the non-private reference (no DP)
    documents/documents.txt                         the documents to write queries for (dp-select: its ledger beside)
    eps-<e>/{generator,synthetic,retriever}/        a DP synthetic row (and -filtered, -selected variants)
    public-prompted/, public-pairs/                 the rows without private data (epsilon 0), the same layout
    direct-<method>-eps-<e>/retriever/              direct DP training on the original pairs (and -selected)
    <row>/metrics.json, per_query.json, mauve.json  test metrics, per test query (for the CI); MAUVE (not DP)
    <output>/stage.json, <row>/metrics.stage.json   each stage's fingerprint
    summary.json, summary.md, budget.json           the table (Carranza et al., Table 3 layout) and the joint cost
    cache/embeddings/<key>.npy                      the public zero-shot encoder's corpus embeddings
"""
