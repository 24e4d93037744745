"""``privret evaluate``: IR metrics of a retriever on one or several datasets (``retrieval``), and the similarity of
synthetic queries to the original ones (``similarity``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.cli.common import build_config, given_flags, out
from privret.cli.options import JsonResultOpt, PrivateDataOpt, device_option, output_file
from privret.errors import InputError

app = typer.Typer(help="Evaluating retrievers and synthetic queries.", no_args_is_help=True)


@app.command("retrieval")
@device_option
def evaluate_retrieval(
    model: Annotated[list[str], typer.Option(
        help="retriever directory, registry name or HF id (repeat with --datasets for several rows)")],
    data: Annotated[Optional[Path], typer.Option("--data", help="one BEIR dataset")] = None,
    datasets: Annotated[Optional[str], typer.Option(
        help="several BEIR datasets, comma-separated: paths or names under --data-root (zero-shot table)")] = None,
    data_root: Annotated[Optional[Path], typer.Option(help="where --datasets names live (privret data download --out)")]
    = None,
    label: Annotated[Optional[list[str]], typer.Option(help="row name per --model in the --datasets table")] = None,
    split: Annotated[str, typer.Option(help="qrels split to evaluate on")] = "test",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the metrics here",
                                                     callback=output_file)] = None,
    per_query_out: Annotated[Optional[Path], typer.Option(
        "--per-query", help="--data: also write each query's metrics here ({qid: {metric: value}}, for paired CIs)",
        callback=output_file)] = None,
    cache_dir: Annotated[Optional[Path], typer.Option(
        help="reuse or store corpus embeddings here (a .npy per model weights and corpus); they reveal what "
             "the model does, so keep them where the model may be kept")] = None,
    index: Annotated[str, typer.Option(
        help="FAISS index: exact, or approximate hnsw or ivf for large corpora (may miss some true top-100 "
             "documents; docs/scaling.md)")] = "exact",
    hnsw_m: Annotated[int, typer.Option(help="--index hnsw: links per node")] = 32,
    hnsw_ef_search: Annotated[int, typer.Option(help="--index hnsw: candidates kept while searching")] = 128,
    ivf_nlist: Annotated[Optional[int], typer.Option(
        help="--index ivf: k-means cells (default 4 sqrt(N), at most N/39)")] = None,
    ivf_nprobe: Annotated[int, typer.Option(help="--index ivf: cells scanned per query")] = 32,
    bf16: Annotated[bool, typer.Option(
        "--bf16/--no-bf16", help="encode under bf16 autocast where the device runs it natively (a GPU's figures "
                                 "then differ from float32 ones by about 0.001); --no-bf16: float32 everywhere, "
                                 "comparable across devices")] = True,
) -> None:
    """FAISS search over the corpus (exact by default); NDCG@10, Recall@10/100, MRR@10 (pytrec_eval).

    `--data D` scores one dataset. `--datasets a,b,c` scores each --model on every dataset and prints
    the Table 5 layout of Carranza et al. (NDCG@10 and Recall@10; a row per retriever, a column per dataset).
    """
    from privret.retrieval.index import SearchIndex

    if (data is None) == (datasets is None):
        raise InputError("give exactly one of --data DIR or --datasets a,b,c", field="--data")
    ignored = given_flags("per_query_out") if datasets is not None else given_flags("data_root", "label")
    if ignored:
        raise InputError(f"applies with {'--data' if datasets is not None else '--datasets'} only", field=ignored[0])
    searched = build_config(SearchIndex, index=index, hnsw_m=hnsw_m, hnsw_ef_search=hnsw_ef_search,
                            ivf_nlist=ivf_nlist, ivf_nprobe=ivf_nprobe)
    if datasets is not None:
        _evaluate_many(model, datasets, data_root, split, label, json_out, cache_dir=cache_dir, index=searched,
                       bf16=bf16)
        return
    if len(model) != 1:
        raise InputError("--data takes one --model (use --datasets for several)", field="--model")
    _evaluate_one(model[0], data, split, json_out, per_query_out, cache_dir=cache_dir, index=searched, bf16=bf16)


def _evaluate_many(models: list[str], datasets: str, data_root: Path | None, split: str, labels: list[str] | None,
                   json_out: Path | None, **search) -> None:
    """Each of ``models`` on every dataset of ``datasets``: one table (a row per model, a column per dataset)."""
    from privret.evaluate.multi import evaluate_many, resolve_datasets, rich_tables
    from privret.io import write_json_atomic

    paths = resolve_datasets(datasets.split(","), data_root)
    result = evaluate_many(list(models), paths, split, labels=list(labels) if labels else None, **search)
    for table in rich_tables(result):
        out.print(table)
    if json_out is not None:
        write_json_atomic(json_out, result)


def _evaluate_one(model: str, data: Path, split: str, json_out: Path | None, per_query_out: Path | None, *,
                  bf16: bool, **search) -> None:
    """``model`` on ``data``'s ``split``: the metrics' table, and the model card's record when privret trained the
    model (unless ``split`` is the private data it was trained on)."""
    from rich.table import Table

    from privret.data.beir import dataset_hash, load_beir
    from privret.data.pairs import pairs_from_beir
    from privret.io import write_json_atomic
    from privret.models.device import precision_label
    from privret.models.encoder import load_encoder
    from privret.models.model_card import record_evaluation
    from privret.privacy.budget import dataset_id
    from privret.privacy.ledger import has_ledger
    from privret.retrieval.metrics import METRICS, evaluate_per_query, mean_metrics

    dataset = load_beir(data, splits=[split])
    encoder = load_encoder(model)
    precision = precision_label(encoder.device, bf16)
    per_query = evaluate_per_query(encoder, dataset.corpus, dataset.queries, dataset.split(split), bf16=bf16,
                                   **search)
    metrics = mean_metrics(per_query)
    if has_ledger(model):  # a model privret trained: its card gets the figures, unless they are of its own log
        as_trained = (dataset_hash(dataset, split), dataset_id(pairs_from_beir(dataset, split)))
        if not record_evaluation(model, data=data.resolve().name, split=split, metrics=metrics,
                                 precision=precision, data_ids=as_trained):
            out.print(f"not added to {model}'s model card: {split} is the private data this DP model was trained on")
    table = Table(title=f"{model} on {data.name}/{split} ({metrics['queries']} queries, {precision})")
    for m in METRICS:
        table.add_column(m, justify="right")
    table.add_row(*(f"{metrics[m]:.4f}" for m in METRICS))
    out.print(table)
    if json_out is not None:
        write_json_atomic(json_out, {**metrics, "precision": precision})
    if per_query_out is not None:
        write_json_atomic(per_query_out, per_query)


@app.command("similarity")
@device_option
def evaluate_similarity(
    synthetic: Annotated[Path, typer.Option(help="synthetic BEIR dataset written by `privret synth generate`")],
    data: PrivateDataOpt,
    split: Annotated[str, typer.Option(help="private split the generator was trained on")] = "train",
    featurizer: Annotated[str, typer.Option(help="sentence encoder for MAUVE features (registry name or path)")]
    = "minilm-l6",
    max_texts: Annotated[Optional[int], typer.Option(help="cap |P| and |Q| for MAUVE (random subsample)")] = None,
    num_buckets: Annotated[str, typer.Option(help="MAUVE k-means buckets: 'auto' (n/10) or an integer")] = "auto",
    seed: Annotated[int, typer.Option(help="subsampling seed (MAUVE's k-means seed stays 25)")] = 0,
    json_out: JsonResultOpt = None,
) -> None:
    """Corpus BLEU (sacrebleu) and MAUVE between synthetic and original queries (Carranza et al., section 6.2).

    Both read the private split without DP: no guarantee covers them, and the --json file says so on its first key.
    """
    from rich.table import Table

    from privret.audit.private_output import mark_private
    from privret.evaluate.similarity import PRIVATE_FIGURES, MauveSettings, evaluate_similarity as run
    from privret.privacy.ledger import format_epsilon
    from privret.io import write_json_atomic

    if num_buckets != "auto":
        try:
            buckets: int | str = int(num_buckets)
        except ValueError:
            raise InputError(f"'{num_buckets}' is neither 'auto' nor an integer", field="--num-buckets") from None
        if buckets < 2:
            raise InputError("must be at least 2", field="--num-buckets")
    else:
        buckets = "auto"
    result = run(data, split, synthetic, featurizer=featurizer, mauve=MauveSettings(num_buckets=buckets),
                 max_texts=max_texts, seed=seed)
    table = Table(title=f"similarity of {synthetic.name} to {data.name}/{split}")
    for column in ("ε", "BLEU", "MAUVE", "pairs", "featuriser"):
        table.add_column(column, justify="right")
    table.add_row(format_epsilon(result["synthetic"]["epsilon"], missing="?"), f"{result['bleu']:.4f}", f"{result['mauve']:.4f}",
                  str(result["pairs"]), featurizer)
    out.print(table)
    if json_out is not None:  # its first key says it holds figures of the private split, not covered by DP
        write_json_atomic(json_out, mark_private(result, PRIVATE_FIGURES))
