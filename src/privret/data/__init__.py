"""Datasets: BEIR-format corpora/queries/qrels, pairs JSONL, privacy units, the demo dataset."""
