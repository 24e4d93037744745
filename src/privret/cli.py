"""The ``privret`` command line: one command per stage, ``pipeline`` for a grid, ``demo``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from privret.errors import EXIT_BAD_INPUT, InputError

app = typer.Typer(help="Dense retrieval on private query logs with differential privacy.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
data_app = typer.Typer(help="Validate and prepare datasets.", no_args_is_help=True)
generator_app = typer.Typer(help="DP fine-tuning of the query generator.", no_args_is_help=True)
retriever_app = typer.Typer(help="Training the dual-encoder retriever.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(generator_app, name="generator")
app.add_typer(retriever_app, name="retriever")
evaluate_app = typer.Typer()
app.add_typer(evaluate_app, name="evaluate")
audit_app = typer.Typer(help="Privacy audits of the data and the models.", no_args_is_help=True)
app.add_typer(audit_app, name="audit")
out = Console()

DataOpt = Annotated[Optional[Path], typer.Option("--data", help="BEIR dataset directory")]
SplitOpt = Annotated[str, typer.Option(help="qrels split holding the private training pairs")]
PairsOpt = Annotated[Optional[Path], typer.Option("--pairs", help="pairs JSONL ({query, doc_id|doc[, user_id]})")]
BudgetCapOpt = Annotated[Optional[float], typer.Option(
    help="refuse to run when all DP releases on this dataset would together exceed this epsilon "
         "(registry: $PRIVRET_BUDGET_DIR, default ~/.cache/privret/budget)")]
AllowOverOpt = Annotated[bool, typer.Option(help="run past --budget-cap anyway (with a warning)")]


@app.callback()
def _global_options(
    trust_remote_pickle: Annotated[bool, typer.Option(
        "--trust-remote-pickle", help="allow loading models whose weights exist only as pickle files "
                                      "(pickles can run code; use only for sources you trust)")] = False,
) -> None:
    """Dense retrieval on private query logs with differential privacy."""
    if trust_remote_pickle:
        from privret.models.safety import set_trust_pickle

        set_trust_pickle(True)


def _budget_policy(cap: float | None, allow_over: bool):
    from privret.privacy.budget import BudgetPolicy

    if cap is not None and not (math.isfinite(cap) and cap > 0):
        raise InputError(f"must be a finite epsilon > 0, got {cap}", field="--budget-cap")
    return BudgetPolicy(cap=cap, allow_over=allow_over)


def _training_pairs(data: Path | None, split: str, pairs: Path | None):
    """Pairs from a BEIR split, or from a pairs file (its doc_ids resolved against --data's corpus)."""
    from privret.data.beir import load_beir, load_corpus
    from privret.data.pairs import load_pairs_jsonl, pairs_from_beir
    from privret.io import file_sha256

    if pairs is not None:
        corpus = load_corpus(data / "corpus.jsonl") if data is not None else None
        return load_pairs_jsonl(pairs, corpus), file_sha256(pairs)
    if data is None:
        raise InputError("give --data DIR (BEIR) or --pairs FILE", field="--data")
    dataset = load_beir(data, splits=[split])
    from privret.pipeline import dataset_hash

    return pairs_from_beir(dataset, split), dataset_hash(dataset, split)


@data_app.command("validate")
def data_validate(path: Annotated[Path, typer.Argument(help="BEIR directory or pairs JSONL file")]) -> None:
    """Check a dataset strictly; exit 2 with file, line and field on the first problem."""
    from privret.data.beir import load_beir
    from privret.data.pairs import load_pairs_jsonl

    if path.is_dir():
        ds = load_beir(path)
        out.print(f"ok: {len(ds.corpus)} documents, {len(ds.queries)} queries, splits "
                  + ", ".join(f"{s} ({len(q)} queries)" for s, q in ds.qrels.items()))
    else:
        tp = load_pairs_jsonl(path)
        out.print(f"ok: {len(tp.pairs)} pairs, {len(tp.units('query'))} query units")


@generator_app.command("train")
def generator_train(
    out_dir: Annotated[Path, typer.Option("--out", help="output directory (generator + privacy ledger)")],
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    model: Annotated[str, typer.Option(help="registry name, local path or HF id")] = "smollm2-135m",
    epsilon: Annotated[float, typer.Option(help="target epsilon; 'inf' for non-private")] = 8.0,
    delta: Annotated[Optional[float], typer.Option(help="default 1/(2n), n units")] = None,
    unit: Annotated[str, typer.Option(help="privacy unit: query, pair or user")] = "query",
    clip_norm: Annotated[float, typer.Option(help="per-unit L2 clipping norm C")] = 1.0,
    batch_size: Annotated[int, typer.Option(help="expected units per step (Poisson)")] = 64,
    epochs: Annotated[float, typer.Option()] = 3.0,
    learning_rate: Annotated[float, typer.Option("--lr")] = 2e-3,
    trainable: Annotated[str, typer.Option(help="lora or full")] = "lora",
    lora_rank: Annotated[int, typer.Option()] = 8,
    trained_layers: Annotated[int, typer.Option(help="train the top k layers (0 = all)")] = 8,
    max_doc_tokens: Annotated[int, typer.Option()] = 128,
    accountant: Annotated[str, typer.Option(help="prv or rdp")] = "prv",
    seed: Annotated[int, typer.Option()] = 0,
    resume: Annotated[bool, typer.Option(help="continue an interrupted run in --out")] = False,
    secure_rng: Annotated[bool, typer.Option(help="DP noise and sampling from the OS CSPRNG (os.urandom)")] = False,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = False,
) -> None:
    """DP fine-tune a generator on document -> query pairs (DP-Adam, per-unit clipping, Poisson)."""
    from privret.train.generator import GeneratorTrainConfig, train_generator

    policy = _budget_policy(budget_cap, allow_over_budget)
    training, data_hash = _training_pairs(data, split, pairs)
    cfg = _config(GeneratorTrainConfig, model=model, epsilon=epsilon, delta=delta, unit=unit, clip_norm=clip_norm,
                  batch_size=batch_size, epochs=epochs, learning_rate=learning_rate, trainable=trainable,
                  lora_rank=lora_rank, trained_layers=trained_layers or None, max_doc_tokens=max_doc_tokens,
                  accountant=accountant, seed=seed, secure_rng=secure_rng)
    ledger = train_generator(training, out_dir, cfg, data_hash=data_hash, resume=resume, budget=policy)
    out.print(f"generator written to {out_dir}: {ledger.summary()}")


@app.command("generate")
def generate(
    generator: Annotated[Path, typer.Option(help="directory written by `privret generator train`")],
    data: Annotated[Path, typer.Option("--data", help="BEIR dataset with the public documents")],
    out_dir: Annotated[Path, typer.Option("--out", help="synthetic BEIR dataset to write")],
    documents: Annotated[str, typer.Option(help="'corpus' (all) or a qrels split name (its documents)")] = "train",
    num_queries: Annotated[int, typer.Option(help="queries per document")] = 1,
    top_p: Annotated[float, typer.Option(help="nucleus sampling p")] = 0.8,
    batch_size: Annotated[int, typer.Option()] = 32,
    seed: Annotated[int, typer.Option()] = 0,
    resume: Annotated[bool, typer.Option(help="continue an interrupted generation")] = False,
) -> None:
    """Sample synthetic queries for public documents; writes a BEIR dataset carrying the ledger."""
    from privret.data.beir import load_beir
    from privret.synth.generate import GenerateConfig, generate_synthetic

    dataset = load_beir(data)
    private = set(dataset.queries.values())
    if documents == "corpus":
        docs = list(dataset.corpus.values())
    else:
        docs = [dataset.corpus[d] for d in dict.fromkeys(d for q in dataset.split(documents).values() for d in q)]
    cfg = _config(GenerateConfig, num_queries=num_queries, top_p=top_p, batch_size=batch_size, seed=seed)
    manifest = generate_synthetic(generator, docs, out_dir, cfg, private_queries=private, resume=resume)
    out.print(f"{manifest['kept']} synthetic queries for {manifest['documents']} documents in {out_dir} "
              f"({manifest['dropped_copies_of_private_queries']} copies of private queries dropped)")


@retriever_app.command("train")
def retriever_train(
    out_dir: Annotated[Path, typer.Option("--out", help="output directory (SentenceTransformer)")],
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    model: Annotated[str, typer.Option(help="encoder: registry name, local path or HF id")] = "minilm-l6",
    epochs: Annotated[float, typer.Option()] = 1.0,
    batch_size: Annotated[int, typer.Option(help="batch size (with --dp: expected units per step)")] = 32,
    learning_rate: Annotated[float, typer.Option("--lr")] = 2e-5,
    temperature: Annotated[Optional[float], typer.Option(
        help="softmax temperature (default 0.05; with --dp logit-dp 0.5)")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    dp: Annotated[Optional[str], typer.Option(
        "--dp", help="train directly with DP: naive, batch-clip, logit-dp or public-negatives")] = None,
    epsilon: Annotated[float, typer.Option(help="--dp: target epsilon")] = 8.0,
    delta: Annotated[Optional[float], typer.Option(help="--dp: default 1/(2n), n units")] = None,
    unit: Annotated[str, typer.Option(help="--dp: privacy unit: query, pair or user")] = "query",
    clip_norm: Annotated[float, typer.Option(help="--dp: clipping norm (C per unit/batch, B per pair)")] = 1.0,
    max_batch_units: Annotated[Optional[int], typer.Option(help="--dp: cap K on units per step")] = None,
    trainable: Annotated[str, typer.Option(help="--dp: all, top:K or lora")] = "all",
    lora_rank: Annotated[int, typer.Option(help="--dp: LoRA rank")] = 8,
    public_negatives: Annotated[int, typer.Option(help="--dp public-negatives: negatives per step")] = 32,
    spreadout_weight: Annotated[float, typer.Option(help="--dp logit-dp: spreadout regulariser weight")] = 0.0,
    accountant: Annotated[str, typer.Option(help="--dp: prv or rdp")] = "prv",
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = False,
) -> None:
    """Train a dual encoder (in-batch softmax) on original or synthetic pairs; --dp trains it with DP directly."""
    from privret.pipeline import non_private_ledger
    from privret.privacy.ledger import LEDGER_FILE, PrivacyLedger
    from privret.runlock import RunLock
    from privret.train.retriever import RetrieverTrainConfig, train_retriever

    policy = _budget_policy(budget_cap, allow_over_budget)
    training, data_hash = _training_pairs(data, split, pairs)
    if dp is not None:
        from privret.train.dp_retriever import METHODS, DPRetrieverConfig, train_dp_retriever

        if dp not in METHODS:
            raise InputError(f"unknown method '{dp}' (choose from {', '.join(METHODS)})", field="--dp")
        dp_cfg = _config(DPRetrieverConfig, method=dp, model=model, epsilon=epsilon, delta=delta, unit=unit,
                         clip_norm=clip_norm, batch_size=batch_size, max_batch_units=max_batch_units, epochs=epochs,
                         learning_rate=learning_rate, temperature=temperature, spreadout_weight=spreadout_weight,
                         trainable=trainable, lora_rank=lora_rank, public_negatives=public_negatives,
                         accountant=accountant, seed=seed)
        with RunLock(out_dir, what="retriever directory"):
            if out_dir.exists():
                raise InputError("already exists (remove it or choose another output)", path=out_dir)
            release_id = _dp_retriever_precheck(training, dp_cfg, data_hash, out_dir, policy)
            ledger = train_dp_retriever(training, out_dir, dp_cfg, data_hash=data_hash, public_corpus=training.corpus)
        from privret.privacy import budget as registry

        registry.record(registry.Release.from_ledger(ledger, release_id=release_id, status="final",
                                                     artefact=out_dir.absolute()), policy)
        out.print(f"retriever written to {out_dir} ({ledger.summary()}, {dp})")
        return
    cfg = _config(RetrieverTrainConfig, model=model, epochs=epochs, batch_size=batch_size,
                  learning_rate=learning_rate, temperature=0.05 if temperature is None else temperature, seed=seed)
    synthetic = data is not None and pairs is None and (data / LEDGER_FILE).exists()
    ledger = PrivacyLedger.load(data) if synthetic else non_private_ledger(training, model, data_hash, "query")
    with RunLock(out_dir, what="retriever directory"):
        train_retriever(training, out_dir, cfg, ledger=ledger)
    out.print(f"retriever written to {out_dir} ({ledger.summary()})")


def _dp_retriever_precheck(training, dp_cfg, data_hash: str, out_dir: Path, policy) -> str:
    """Record the planned direct-DP release in the budget registry (cap check) before training."""
    from privret.privacy import budget as registry
    from privret.privacy.accounting import spent_epsilon
    from privret.train.dp_retriever import plan

    n_units = len(training.units(dp_cfg.unit))
    sample_rate, steps, delta, mech = plan(dp_cfg, n_units)
    release_id = registry.new_release_id()
    planned = registry.Release(
        release_id=release_id, status="planned", data_hash=data_hash, unit=dp_cfg.unit.value, n_units=n_units,
        mechanism=f"direct-{dp_cfg.method}", accountant=dp_cfg.accountant, noise_multiplier=mech.sigma,
        sample_rate=sample_rate, steps=steps, delta=delta,
        epsilon=spent_epsilon(noise_multiplier=mech.sigma, sample_rate=sample_rate, steps=steps, delta=delta,
                              accountant=dp_cfg.accountant), artefact=str(out_dir.absolute()))
    registry.check_and_record(planned, policy)
    return release_id


@evaluate_app.callback(invoke_without_command=True)
def evaluate(
    ctx: typer.Context,
    model: Annotated[Optional[list[str]], typer.Option(
        help="retriever directory, registry name or HF id (repeat with --datasets for several rows)")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="one BEIR dataset")] = None,
    datasets: Annotated[Optional[str], typer.Option(
        help="several BEIR datasets, comma-separated: paths or names under --data-root (zero-shot table)")] = None,
    data_root: Annotated[Optional[Path], typer.Option(help="where --datasets names live (privret data download --out)")]
    = None,
    label: Annotated[Optional[list[str]], typer.Option(help="row name per --model in the --datasets table")] = None,
    split: Annotated[str, typer.Option(help="qrels split to evaluate on")] = "test",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the metrics here")] = None,
) -> None:
    """Exact FAISS search over the corpus; NDCG@10, Recall@10/100, MRR@10 (pytrec_eval).

    `--data D` scores one dataset. `--datasets a,b,c` scores each --model on every dataset and prints
    the seed's Table 5 layout (NDCG@10 and Recall@10; a row per retriever, a column per dataset).
    """
    if ctx.invoked_subcommand is not None:
        return
    if not model:
        if data is None and datasets is None:
            out.print(ctx.get_help())
            raise typer.Exit(0)
        raise InputError("give the retriever to evaluate with --model", field="--model")
    if (data is None) == (datasets is None):
        raise InputError("give exactly one of --data DIR or --datasets a,b,c", field="--data")
    from privret.io import write_json_atomic

    if datasets is not None:
        from privret.evaluate.multi import evaluate_many, resolve_datasets, rich_tables

        paths = resolve_datasets(datasets.split(","), data_root)
        result = evaluate_many(list(model), paths, split, labels=list(label) if label else None)
        for table in rich_tables(result):
            out.print(table)
        if json_out is not None:
            write_json_atomic(json_out, result)
        return
    if len(model) != 1:
        raise InputError("--data takes one --model (use --datasets for several)", field="--model")
    from rich.table import Table

    from privret.data.beir import load_beir
    from privret.evaluate.retrieval import METRICS, evaluate_retriever
    from privret.models.encoder import load_encoder

    dataset = load_beir(data, splits=[split])
    metrics = evaluate_retriever(load_encoder(model[0]), dataset.corpus, dataset.queries, dataset.split(split))
    table = Table(title=f"{model[0]} on {data.name}/{split} ({metrics['queries']} queries)")
    for m in METRICS:
        table.add_column(m, justify="right")
    table.add_row(*(f"{metrics[m]:.4f}" for m in METRICS))
    out.print(table)
    if json_out is not None:
        write_json_atomic(json_out, metrics)


@evaluate_app.command("similarity")
def evaluate_similarity(
    synthetic: Annotated[Path, typer.Option(help="synthetic BEIR dataset written by `privret generate`")],
    data: Annotated[Path, typer.Option("--data", help="the private BEIR dataset")],
    split: Annotated[str, typer.Option(help="private split the generator was trained on")] = "train",
    featurizer: Annotated[str, typer.Option(help="sentence encoder for MAUVE features (registry name or path)")]
    = "minilm-l6",
    max_texts: Annotated[Optional[int], typer.Option(help="cap |P| and |Q| for MAUVE (random subsample)")] = None,
    num_buckets: Annotated[str, typer.Option(help="MAUVE k-means buckets: 'auto' (n/10) or an integer")] = "auto",
    seed: Annotated[int, typer.Option(help="subsampling seed (MAUVE's k-means seed stays 25)")] = 0,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the result here (JSON)")] = None,
) -> None:
    """Corpus BLEU (sacrebleu) and MAUVE between synthetic and original queries (seed section 6.2)."""
    from rich.table import Table

    from privret.evaluate.similarity import MauveSettings, evaluate_similarity as run, format_epsilon
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
    table.add_row(format_epsilon(result["synthetic"]["epsilon"]), f"{result['bleu']:.4f}", f"{result['mauve']:.4f}",
                  str(result["pairs"]), featurizer)
    out.print(table)
    if json_out is not None:
        write_json_atomic(json_out, result)


@audit_app.command("overlap")
def audit_overlap(
    data: Annotated[Path, typer.Option("--data", help="the private BEIR dataset")],
    corpus: Annotated[Optional[list[Path]], typer.Option(
        help="text corpus standing for the pretraining data: .txt (a record per line) or .jsonl; .gz ok; repeatable")]
    = None,
    split: Annotated[str, typer.Option(help="split holding the private queries")] = "train",
    field: Annotated[Optional[str], typer.Option(help="JSONL field with the text (default 'text' for *.jsonl)")]
    = None,
    min_tokens: Annotated[int, typer.Option(help="leave out queries shorter than this (normalised tokens)")] = 1,
    sample: Annotated[Optional[int], typer.Option(help="check a random sample of this many private queries")] = None,
    likelihood: Annotated[bool, typer.Option(help="also run the likelihood test (no corpus needed)")] = True,
    model: Annotated[str, typer.Option(help="public causal LM for the likelihood test")] = "smollm2-135m",
    heldout_split: Annotated[str, typer.Option(help="never-private queries of the same distribution")] = "test",
    max_queries: Annotated[int, typer.Option(help="likelihood test: queries per set (random subsample)")] = 1000,
    seed: Annotated[int, typer.Option()] = 0,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the result here (JSON)")] = None,
) -> None:
    """Private queries/documents found verbatim in a public corpus, and the public LM's loss gap (seed 5.2.3)."""
    from rich.table import Table

    from privret.io import write_json_atomic

    if not corpus and not likelihood:
        raise InputError("nothing to do: give --corpus FILE and/or keep --likelihood", field="--corpus")
    result: dict = {}
    if corpus:
        from privret.evaluate.overlap import corpus_overlap

        result["overlap"] = corpus_overlap(data, split, list(corpus), field=field, min_tokens=min_tokens,
                                           sample=sample, seed=seed)
        table = Table(title=f"verbatim overlap of {data.name}/{split} with {len(corpus)} corpus file(s)")
        for column in ("", "checked", "found", "fraction"):
            table.add_column(column, justify="right")
        for kind in ("queries", "documents"):
            row = result["overlap"][kind]
            table.add_row(kind, str(row["eligible"]), str(row["found"]),
                          "-" if row["fraction"] is None else f"{row['fraction']:.2%}")
        out.print(table)
    if likelihood:
        from privret.data.beir import load_beir
        from privret.evaluate.overlap import likelihood_test, queries_of_split

        dataset = load_beir(data, splits=[split, heldout_split])
        lik = likelihood_test(queries_of_split(dataset, split), queries_of_split(dataset, heldout_split),
                              model=model, max_queries=max_queries, seed=seed)
        result["likelihood"] = {**lik, "private_split": split, "heldout_split": heldout_split}
        table = Table(title=f"likelihood test: {model} on {split} (private) vs {heldout_split} (held out)")
        for column in ("loss private", "loss held-out", "gap", "AUC", "z", "p", "flagged"):
            table.add_column(column, justify="right")
        table.add_row(f"{lik['private']['mean']:.3f}", f"{lik['heldout']['mean']:.3f}", f"{lik['mean_gap']:+.3f}",
                      f"{lik['auc']:.3f}", f"{lik['z']:.2f}", f"{lik['p_value']:.2g}",
                      "[bold red]yes[/]" if lik["flagged"] else "no")
        out.print(table)
    if json_out is not None:
        write_json_atomic(json_out, result)


@data_app.command("download")
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


@audit_app.command("canaries")
def audit_canaries(
    out_dir: Annotated[Path, typer.Option("--out", help="audit directory (trial generators + canaries.json); "
                                          "RUN_DIR/canaries puts it in a run's report")],
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    epsilons: Annotated[str, typer.Option(help="comma-separated target epsilons; 'inf' = non-private")] = "inf,16",
    trials: Annotated[int, typer.Option(help="independent trials (fresh canaries, fresh training)")] = 3,
    repetitions: Annotated[str, typer.Option(help="comma-separated insertion counts")] = "1,10,100",
    candidates: Annotated[int, typer.Option(help="the secret is ranked among this many candidates")] = 100,
    samples: Annotated[int, typer.Option(help="queries sampled per canary document to test 'leaked'")] = 10,
    top_p: Annotated[float, typer.Option(help="nucleus sampling p for the leak test")] = 0.8,
    subsample: Annotated[Optional[int], typer.Option(help="keep this many private pairs (uniform, seeded)")] = None,
    unit: Annotated[str, typer.Option(help="privacy unit: query (a canary = 1 unit) or pair (k units)")] = "query",
    model: Annotated[str, typer.Option(help="generator: registry name, local path or HF id")] = "smollm2-135m",
    clip_norm: Annotated[float, typer.Option(help="per-unit L2 clipping norm C")] = 1.0,
    batch_size: Annotated[int, typer.Option(help="expected units per step (Poisson)")] = 32,
    epochs: Annotated[float, typer.Option()] = 2.0,
    learning_rate: Annotated[float, typer.Option("--lr")] = 1e-3,
    trainable: Annotated[str, typer.Option(help="lora or full")] = "lora",
    lora_rank: Annotated[int, typer.Option()] = 16,
    trained_layers: Annotated[int, typer.Option(help="train the top k layers (0 = all)")] = 4,
    max_doc_tokens: Annotated[int, typer.Option()] = 64,
    alpha: Annotated[float, typer.Option(help="the epsilon lower bound holds with confidence 1 - alpha")] = 0.05,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Canary exposure audit of the DP generator (seed 6.3): rank, exposure, leaks, epsilon lower bound."""
    from privret.evaluate.canaries import CanaryAuditConfig, canary_table_markdown, run_canary_audit

    def numbers(text: str, field: str, cast):
        try:
            return [cast(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise InputError(f"'{text}' is not a comma-separated list of numbers", field=field) from None

    training, data_hash = _training_pairs(data, split, pairs)
    generator = {"model": model, "unit": unit, "clip_norm": clip_norm, "batch_size": batch_size, "epochs": epochs,
                 "learning_rate": learning_rate, "trainable": trainable, "lora_rank": lora_rank,
                 "trained_layers": trained_layers or None, "max_doc_tokens": max_doc_tokens, "seed": seed}
    cfg = _config(CanaryAuditConfig, epsilons=numbers(epsilons, "--epsilons", float), trials=trials,
                  repetitions=numbers(repetitions, "--repetitions", int), candidates=candidates, samples=samples,
                  top_p=top_p, subsample=subsample, alpha=alpha, seed=seed, generator=generator)
    report = run_canary_audit(training, out_dir, cfg, data_hash=data_hash)
    typer.echo(canary_table_markdown(report))
    out.print(f"written: {out_dir / 'canaries.json'}")


@app.command("report")
def report(
    run_dir: Annotated[Path, typer.Argument(help="run directory written by `privret pipeline`")],
    out_file: Annotated[Optional[Path], typer.Option("--out", help="HTML file (default RUN_DIR/report.html)")]
    = None,
    show_private_queries: Annotated[bool, typer.Option(
        help="also show original (private) queries and the non-private generator's examples")] = False,
    examples: Annotated[int, typer.Option(help="documents in the example-queries table")] = 3,
) -> None:
    """One self-contained HTML report (plot, tables, examples, ledgers) + a Markdown summary."""
    from privret.report import build_report

    html_path, md_path, markdown = build_report(run_dir, out=out_file, show_private_queries=show_private_queries,
                                                examples=examples)
    typer.echo(markdown)
    out.print(f"report: {html_path.resolve()}  (Markdown: {md_path.resolve()})")


@app.command("pipeline")
def pipeline(
    config: Annotated[Path, typer.Argument(help="pipeline YAML (see configs/)")],
    run_dir: Annotated[Optional[Path], typer.Option(help="default runs/<name>")] = None,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = False,
) -> None:
    """Zero-shot, original pairs and DP synthetic at every epsilon; re-running skips finished stages."""
    from privret.config import load_config
    from privret.pipeline import run_pipeline, summary_table

    policy = _budget_policy(budget_cap, allow_over_budget)
    cfg = load_config(config)
    target = run_dir or Path("runs") / cfg.name
    rows = run_pipeline(cfg, target, budget=policy)
    out.print(summary_table(rows))
    out.print(f"results: {target.resolve()}/summary.md")


@app.command("demo")
def demo(run_dir: Annotated[Path, typer.Option(help="where to write the demo run")] = Path("runs/demo")) -> None:
    """The pipeline at epsilon = 8 plus the non-private references on the bundled demo dataset."""
    from privret.data.demo import demo_config
    from privret.pipeline import run_pipeline, summary_table

    rows = run_pipeline(demo_config(), run_dir)
    out.print(summary_table(rows))
    out.print(f"results: {run_dir.resolve()}/summary.md")


# --- federated answer sentence selection (issue 5): `privret data fed-squad`, `privret federated ...` ---
federated_app = typer.Typer(help="Federated dense retrieval for answer sentence selection (PDD-AS2, Flower).",
                            no_args_is_help=True)
app.add_typer(federated_app, name="federated")


@data_app.command("fed-squad")
def data_fed_squad(
    squad: Annotated[Path, typer.Option(help="SQuAD-format JSON (e.g. ../shared/data/squad/squad-v1.1-dev-40.json)")],
    out_dir: Annotated[Path, typer.Option("--out", help="Fed-SQuAD directory to write")],
    clients: Annotated[int, typer.Option(help="number of clients (unequal sizes)")] = 10,
    test_fraction: Annotated[float, typer.Option(help="share of each client's questions held out")] = 0.3,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Build the multi-client OD-AS2 benchmark (grouping, sentences, answer sentences, passages, splits)."""
    from privret.data.fed_squad import build_fed_squad

    manifest = build_fed_squad(squad, out_dir, n_clients=clients, test_fraction=test_fraction, seed=seed)
    for c in manifest["clients"]:
        out.print(f"{c['client']}: {len(c['articles'])} articles, {c['sentences']} sentences, "
                  f"{c['train_questions']} train / {c['test_questions']} test questions")
    out.print(f"written to {out_dir} ({manifest['dropped_questions']} questions without an answer sentence dropped)")


def _fed_config(config: Path | None, **overrides):
    import yaml

    from privret.federated.config import FedConfig

    values = {}
    if config is not None:
        if not config.is_file():
            raise InputError("config file not found", path=config)
        try:
            values = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            line = getattr(getattr(err, "problem_mark", None), "line", None)
            raise InputError("malformed YAML", path=config, line=None if line is None else line + 1) from None
        if not isinstance(values, dict):
            raise InputError("expected a mapping of FedConfig fields", path=config)
        unknown = sorted(set(values) - set(FedConfig.model_fields))
        if unknown:
            raise InputError("unknown field", path=config, field=unknown[0])
    values.update({k: v for k, v in overrides.items() if v is not None})
    return _config(FedConfig, **values)


@federated_app.command("train")
def federated_train(
    data: Annotated[Path, typer.Option("--data", help="Fed-SQuAD directory (privret data fed-squad)")],
    out_dir: Annotated[Path, typer.Option("--out", help="run directory (checkpoints, results.json, ledger)")],
    config: Annotated[Optional[Path], typer.Option(help="YAML with FedConfig fields (configs/fed-squad.yaml)")] = None,
    baseline: Annotated[str, typer.Option(help="pdd-as2 (Flower), local-only, central, bm25 or zero-shot")] = "pdd-as2",
    model: Annotated[Optional[str], typer.Option(help="encoder: registry name, local path or HF id")] = None,
    rounds: Annotated[Optional[int], typer.Option(help="FedAvg rounds")] = None,
    warmup_rounds: Annotated[Optional[int], typer.Option(help="rounds with BM25 negatives")] = None,
    local_epochs: Annotated[Optional[int], typer.Option()] = None,
    train_fraction: Annotated[Optional[float], typer.Option(help="share of each client's training questions")] = None,
    dp: Annotated[Optional[str], typer.Option(help="none, server or client (Flower DP-FedAvg wrappers)")] = None,
    dp_noise_multiplier: Annotated[Optional[float], typer.Option()] = None,
    dp_clip_norm: Annotated[Optional[float], typer.Option()] = None,
    threads: Annotated[int, typer.Option(help="torch CPU threads")] = 1,
    resume: Annotated[bool, typer.Option(help="continue from the last finished round in --out")] = True,
) -> None:
    """PDD-AS2 + client-customized query encoders + Fed-Negative with the Flower apps on this machine."""
    import torch

    from privret.federated import runner

    torch.set_num_threads(threads)
    cfg = _fed_config(config, model=model, rounds=rounds, warmup_rounds=warmup_rounds, local_epochs=local_epochs,
                      train_fraction=train_fraction, dp=dp, dp_noise_multiplier=dp_noise_multiplier,
                      dp_clip_norm=dp_clip_norm)
    clients = runner.require_data(data)
    if baseline == "pdd-as2":
        results = runner.run_federated_local(cfg, data, out_dir, resume=resume)
        evaluations = results["evaluations"]
    else:
        fns = {"local-only": runner.train_local_only, "central": runner.train_central,
               "zero-shot": runner.evaluate_zero_shot, "bm25": lambda _cfg, cl: runner.evaluate_bm25_all(cl)}
        if baseline not in fns:
            raise InputError(f"unknown baseline '{baseline}'", field="--baseline")
        evaluations = {baseline: fns[baseline](cfg, clients)}
        out_dir.mkdir(parents=True, exist_ok=True)
        runner.save_result(out_dir / f"{baseline}.json", evaluations[baseline], config=cfg.model_dump(mode="json"))
    for name, ev in evaluations.items():
        s, p = ev["pooled"]["sentence"], ev["pooled"]["passage"]
        out.print(f"{name}: sentence MRR@10 {s['mrr@10']:.3f} R@1 {s['recall@1']:.3f} R@20 {s['recall@20']:.3f} "
                  f"R@100 {s['recall@100']:.3f} | passage MRR@10 {p['mrr@10']:.3f} R@1 {p['recall@1']:.3f}")
    out.print(f"results in {out_dir}")


@federated_app.command("flower-app")
def federated_flower_app(
    app_dir: Annotated[Path, typer.Option("--app", help="directory to write the Flower App into")],
    out_dir: Annotated[str, typer.Option("--out", help="where the ServerApp writes results (on the SuperLink host)")],
    num_clients: Annotated[int, typer.Option(help="SuperNodes to wait for")] = 10,
    config: Annotated[Optional[Path], typer.Option(help="YAML with FedConfig fields")] = None,
) -> None:
    """Write a Flower App (pyproject.toml) for `flwr run APP SUPERLINK` across machines."""
    from privret.federated.runner import write_flower_app

    write_flower_app(app_dir, _fed_config(config), out_dir=out_dir, num_clients=num_clients)
    out.print(f"Flower App written to {app_dir}; run it with: flwr run {app_dir} <superlink-connection>")


def _config(cls, **values):
    from pydantic import ValidationError

    try:
        return cls(**values)
    except ValidationError as err:
        first = err.errors()[0]
        raise InputError(first["msg"], field="--" + "-".join(str(p) for p in first["loc"]).replace("_", "-")) from None


def main() -> None:
    try:
        app()
    except InputError as err:
        Console(stderr=True).print(f"[bold red]error:[/] {err.one_line()}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
