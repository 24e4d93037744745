"""Zero-shot evaluation of retrievers on several BEIR datasets, in the layout of Table 5 of Carranza et al.

Each dataset is searched exactly (see :mod:`privret.retrieval.search`) and scored with NDCG@10 and
Recall@10 (plus Recall@100 and MRR@10 in the JSON). A dataset given as a name is looked up under
``data_root`` (``<data_root>/<name>``, the layout ``privret data download`` writes); a path is used
as is. A directory without ``corpus.jsonl`` whose sub-directories are BEIR datasets (CQADupStack's
layout) is scored as the mean over its sub-datasets, as BEIR does.

Table 5 layout: one row per retriever (Source, epsilon), one column per dataset; one table for
NDCG@10 and one for Recall@10. The epsilon of a row is read from the retriever's privacy ledger
(written beside every retriever privret trains; ``inf`` for a non-private one) when it has one.
"""

from __future__ import annotations

from pathlib import Path

from privret.data.beir import load_beir
from privret.errors import InputError
from privret.privacy.ledger import format_epsilon
from privret.retrieval.metrics import METRICS, evaluate_retriever

TABLE_METRICS = ("ndcg@10", "recall@10")


def resolve_datasets(specs: list[str], data_root: Path | None) -> dict[str, Path]:
    """``name -> directory`` for each comma-separated entry (a path, or a name under ``data_root``)."""
    out: dict[str, Path] = {}
    for spec in specs:
        spec = spec.strip()
        if not spec:
            continue
        path = Path(spec).expanduser()
        if not path.is_dir() and data_root is not None and (data_root / spec).is_dir():
            path = data_root / spec
        if not path.is_dir():
            hint = f" (looked in {data_root})" if data_root is not None else ""
            raise InputError(f"dataset '{spec}' not found{hint}; give a BEIR directory, or the name of one in the "
                             "data root (`privret data download` fetches public ones)", field="datasets")
        label = path.name
        if label in out:
            raise InputError(f"dataset '{label}' given twice", field="datasets")
        out[label] = path
    if not out:
        raise InputError("no dataset given", field="datasets")
    return out


def _parts(path: Path) -> list[Path]:
    if (path / "corpus.jsonl").is_file():
        return [path]
    subs = sorted(p for p in path.iterdir() if p.is_dir() and (p / "corpus.jsonl").is_file())
    if not subs:
        raise InputError("not a BEIR dataset (no corpus.jsonl, and no sub-dataset that has one)", path=path)
    return subs


def evaluate_dataset(model, path: Path, split: str, *, cache_dir: Path | None = None, index=None,
                     bf16: bool = True) -> dict:
    """Metrics of ``model`` on one dataset (mean over sub-datasets for a CQADupStack-style folder);
    ``cache_dir``: corpus embeddings reused or stored there, ``index``: the FAISS index searched, ``bf16``:
    autocast where native (:func:`~privret.retrieval.search.search`)."""
    per_part = []
    for part in _parts(path):
        dataset = load_beir(part, splits=[split])
        per_part.append(evaluate_retriever(model, dataset.corpus, dataset.queries, dataset.split(split),
                                           cache_dir=cache_dir, index=index, bf16=bf16))
    if len(per_part) == 1:
        return per_part[0]
    mean = {m: sum(r[m] for r in per_part) / len(per_part) for m in METRICS}
    mean["queries"] = sum(r["queries"] for r in per_part)
    mean["sub_datasets"] = len(per_part)
    return mean


def retriever_epsilon(model_name: str) -> float | None:
    """epsilon from the retriever's privacy ledger, if it is a directory with one."""
    from privret.privacy.ledger import PrivacyLedger, has_ledger

    if has_ledger(model_name):
        return PrivacyLedger.load(Path(model_name).expanduser()).epsilon
    return None


def evaluate_many(models: list[str], datasets: dict[str, Path], split: str, *,
                  labels: list[str] | None = None, cache_dir: Path | None = None, index=None,
                  bf16: bool = True) -> dict:
    """Every model on every dataset; the rows of the Table 5 layout as JSON-ready dicts."""
    from privret.models.device import precision_label
    from privret.models.encoder import load_encoder

    if labels and len(labels) != len(models):
        raise InputError(f"give one label per model ({len(models)} models, {len(labels)} labels)",
                         field="label")
    rows = []
    for i, name in enumerate(models):
        model = load_encoder(name)
        metrics = {label: evaluate_dataset(model, path, split, cache_dir=cache_dir, index=index, bf16=bf16)
                   for label, path in datasets.items()}
        rows.append({"source": labels[i] if labels else Path(name).name or name, "model": name,
                     "epsilon": retriever_epsilon(name), "precision": precision_label(model.device, bf16),
                     "metrics": metrics})
    return {"split": split, "datasets": {k: str(v) for k, v in datasets.items()}, "rows": rows}


def rich_tables(result: dict) -> list:
    """One rich Table per metric of Table 5 (NDCG@10, Recall@10)."""
    from rich.table import Table

    tables = []
    for metric in TABLE_METRICS:
        table = Table(title=f"Zero-shot {metric.upper()} ({result['split']} split)")
        table.add_column("Source")
        table.add_column("ε", justify="right")
        for label in result["datasets"]:
            table.add_column(label, justify="right")
        for row in result["rows"]:
            table.add_row(row["source"], format_epsilon(row["epsilon"]),
                          *(f"{row['metrics'][d][metric]:.4f}" for d in result["datasets"]))
        tables.append(table)
    return tables


def markdown_tables(result: dict) -> str:
    lines = []
    for metric in TABLE_METRICS:
        names = list(result["datasets"])
        lines.append(f"{metric.upper()}:")
        lines.append("")
        lines.append("| Source | ε | " + " | ".join(names) + " |")
        lines.append("|---|---|" + "---:|" * len(names))
        for row in result["rows"]:
            lines.append(f"| {row['source']} | {format_epsilon(row['epsilon'])} | "
                         + " | ".join(f"{row['metrics'][d][metric]:.4f}" for d in names) + " |")
        lines.append("")
    return "\n".join(lines)
