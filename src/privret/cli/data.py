"""``privret data``: validate, download and build datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.cli.common import flag, out
from privret.cli.options import (AllowOverOpt, BudgetCapOpt, DataOpt, DatasetNameOpt, PairsOpt, SplitOpt,
                                 UnitOpt, output_file)

app = typer.Typer(help="Validate and prepare datasets.", no_args_is_help=True)


@app.command("validate")
def data_validate(
    path: Annotated[Path, typer.Argument(help="BEIR directory or pairs JSONL file")],
    corpus: Annotated[Optional[Path], typer.Option(
        help="a pairs file's doc_id rows: the BEIR directory (or its corpus.jsonl) whose documents they name")]
    = None,
) -> None:
    """Check a dataset strictly; exit 2 with file, line and field on the first problem."""
    from privret.data.beir import load_beir, load_corpus
    from privret.data.pairs import load_pairs_jsonl
    from privret.errors import InputError

    if path.is_dir():
        if corpus is not None:
            raise InputError("applies to a pairs file only (a BEIR directory has its corpus)", field="--corpus")
        ds = load_beir(path)
        out.print(f"ok: {len(ds.corpus)} documents, {len(ds.queries)} queries, splits "
                  + ", ".join(f"{s} ({len(q)} queries)" for s, q in ds.qrels.items()))
    else:
        documents = None if corpus is None else load_corpus(corpus / "corpus.jsonl" if corpus.is_dir() else corpus)
        tp = load_pairs_jsonl(path, documents)
        out.print(f"ok: {len(tp.pairs)} pairs, {len(tp.units('query'))} query units")


@app.command("download")
def data_download(
    name: Annotated[str, typer.Argument(help="BEIR dataset name, e.g. scifact, nfcorpus, fiqa")],
    out_dir: Annotated[Path, typer.Option("--out", help="datasets folder; the dataset lands in OUT/NAME")]
    = Path("datasets"),
    url: Annotated[Optional[str], typer.Option(help="another URL for the archive (mirror)")] = None,
    md5: Annotated[Optional[str], typer.Option(help="expected MD5 (default: BEIR's published one)")] = None,
    archive: Annotated[Optional[Path], typer.Option(help="an archive fetched by hand: verify and unpack it")] = None,
    force: Annotated[bool, typer.Option(help="replace OUT/NAME if present")] = False,
) -> None:
    """Download a public BEIR dataset by its official archive URL, verify its MD5, unpack atomically."""
    from privret.data.download import download_dataset

    info = download_dataset(name, out_dir, url=url, md5=md5, archive=archive, force=force)
    if info["status"] == "present":
        out.print(f"{info['path']} already present (--force to replace)")
    else:
        out.print(f"{name}: {info['status']} to {info['path']} (md5 {info['md5']} verified)")


SquadOpt = Annotated[Path, typer.Option(help="SQuAD-format JSON (e.g. ../shared/data/squad/squad-v1.1-dev-40.json)")]


@app.command("fed-squad")
def data_fed_squad(
    squad: SquadOpt,
    out_dir: Annotated[Path, typer.Option("--out", help="Fed-SQuAD directory to write")],
    clients: Annotated[int, typer.Option(help="number of clients (unequal sizes)")] = 10,
    test_fraction: Annotated[float, typer.Option(help="share of each client's questions held out")] = 0.3,
    seed: Annotated[int, typer.Option(help="seed of the article order (the grouping into clients) and of the "
                                           "train/test split")] = 0,
) -> None:
    """Build the multi-client OD-AS2 benchmark (grouping, sentences, answer sentences, passages, splits)."""
    from privret.data.fed_squad import build_fed_squad

    manifest = build_fed_squad(squad, out_dir, n_clients=clients, test_fraction=test_fraction, seed=seed)
    for c in manifest["clients"]:
        out.print(f"{c['client']}: {len(c['articles'])} articles, {c['sentences']} sentences, "
                  f"{c['train_questions']} train / {c['test_questions']} test questions")
    out.print(f"written to {out_dir} ({manifest['dropped_questions']} questions without an answer sentence dropped)")


@app.command("select-documents")
def data_select_documents(
    out_dir: Annotated[Path, typer.Option("--out", help="selection directory (documents.txt + privacy ledger)")],
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    unit: UnitOpt = "query",
    epsilon: Annotated[float, typer.Option(help="Laplace epsilon (the ledger adds ln(1/(1-delta)))")] = 1.0,
    delta: Annotated[Optional[float], typer.Option(help="default 1/(10n), n units")] = None,
    max_docs_per_unit: Annotated[int, typer.Option(help="documents one unit may count for (m)")] = 1,
    dataset_name: DatasetNameOpt = None,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = None,
) -> None:
    """DP choice of the documents to write synthetic queries for (Laplace partition selection).

    A DP release on the private pairs, recorded in the budget registry; pass the directory to
    `privret synth generate --documents`, which composes its ledger into the synthetic set's."""
    from privret.cli.common import budget_policy, build_config, training_pairs
    from privret.data.pairs import PrivacyUnit
    from privret.errors import InputError
    from privret.privacy import budget as budget_registry
    from privret.privacy.partition_selection import selection_threshold
    from privret.settings.partition_selection import PartitionSelectionConfig
    from privret.synth.documents import SELECTED_IDS_FILE, recorded_dp_selection, write_selection

    if (out_dir / SELECTED_IDS_FILE).exists():
        raise InputError("already holds a selection (remove it or choose another output)", path=out_dir)
    policy = budget_policy(budget_cap, allow_over_budget)
    training, data_hash = training_pairs(data, split, pairs)
    cfg = build_config(PartitionSelectionConfig, epsilon=epsilon, delta=delta, max_docs_per_unit=max_docs_per_unit)
    ids, ledger = recorded_dp_selection(training, PrivacyUnit(unit), cfg, data_hash=data_hash,
                                        dataset_id=budget_registry.dataset_id(training, dataset_name),
                                        directory=out_dir, budget=policy, field_name=flag)
    write_selection(out_dir, ids, ledger)
    out.print(f"{len(ids)} documents selected (threshold {selection_threshold(cfg, ledger.delta):.3g} units per "
              f"document) in {out_dir} ({ledger.summary()})")


@app.command("squad-beir")
def data_squad_beir(
    squad: SquadOpt,
    out_dir: Annotated[Path, typer.Option("--out", help="BEIR directory to write (must not exist)")],
    test_articles: Annotated[int, typer.Option(help="articles whose questions form the test split")] = 8,
    seed: Annotated[int, typer.Option(help="seed of the article order (sha256(seed:title))")] = 0,
    validation_articles: Annotated[int, typer.Option(
        help="training articles whose questions form a validation split (to choose settings on; not in the log)")] = 0,
) -> None:
    """SQuAD as a BEIR dataset: a larger private query log, split by article.

    The corpus is every paragraph (id ARTICLE-PARAGRAPH, positions in the
    file); a question's one relevant document is its own paragraph. Articles
    are ordered by sha256(seed:title), whatever the file's order: the first
    --test-articles give the test queries, the questions of all the others
    are the train qrels (the private log). No article is in both splits.
    --validation-articles K moves the questions of K training articles
    (in sha256("validation:INDEX") order) to a validation split."""
    from privret.data.squad_beir import build_squad_beir

    manifest = build_squad_beir(squad, out_dir, test_articles=test_articles, seed=seed,
                                validation_articles=validation_articles)
    splits = ", ".join(f"{name}: {len(s['articles'])} articles, {s['queries']} queries"
                       for name, s in manifest["splits"].items())
    out.print(f"{manifest['documents']} documents; {splits}; written to {out_dir}")


@app.command("public-proxy")
def data_public_proxy(
    synthetic: Annotated[Path, typer.Option(
        help="an epsilon-0 synthetic set (privret synth generate with a prompted or public-pairs generator)")],
    corpus: Annotated[Path, typer.Option(help="the public corpus: a BEIR directory or its corpus.jsonl")],
    out_dir: Annotated[Path, typer.Option("--out", help="BEIR directory to write (must not exist)")],
    train: Annotated[int, typer.Option(min=1, help="documents whose synthetic queries form the train split (the log)")],
    validation: Annotated[int, typer.Option(min=1, help="documents whose synthetic queries form the validation split")],
    seed: Annotated[int, typer.Option(help="seed of the document order (sha256(seed:doc id))")] = 0,
) -> None:
    """A public proxy log in a private log's domain, to choose DP settings on.

    The synthetic set must carry an epsilon-0 ledger (no private data), so a
    choice made on the proxy spends no budget. Its documents in
    sha256(seed:doc id) order: the first --train give the train qrels, the
    next --validation the validation qrels (one document's queries stay in
    one split). The corpus is the whole public corpus."""
    from privret.synth.public_proxy import build_public_proxy

    manifest = build_public_proxy(synthetic, corpus, out_dir, train_documents=train,
                                  validation_documents=validation, seed=seed)
    splits = ", ".join(f"{name}: {s['documents']} documents, {s['queries']} queries"
                       for name, s in manifest["splits"].items())
    out.print(f"{manifest['documents']} documents; {splits}; written to {out_dir}")


@app.command("squad-pairs")
def data_squad_pairs(
    squad: SquadOpt,
    out_file: Annotated[Path, typer.Option("--out", help="public pairs JSONL to write ({query, doc} rows)",
                                           callback=output_file)],
    paragraphs: Annotated[Optional[int], typer.Option(
        help="draw this many paragraphs (seeded, without replacement); default: every paragraph")] = None,
    seed: Annotated[int, typer.Option(help="seed of the paragraph sample and of each paragraph's question")] = 0,
) -> None:
    """A public pairs file from SQuAD: one question for each (drawn) paragraph, the paragraph inline.

    The input of the epsilon = 0 rows (`generator train --public-pairs`, `public_rows.public_pairs`) and of
    the public warm start. Paragraphs without an answerable question are skipped. The file must be public
    and must not hold the private log's queries."""
    from privret.data.squad_pairs import write_squad_public_pairs

    n = write_squad_public_pairs(squad, out_file, paragraphs=paragraphs, seed=seed)
    out.print(f"{n} public pairs (one question per paragraph) written to {out_file}")
