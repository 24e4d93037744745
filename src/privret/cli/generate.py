"""``privret generate``: synthetic queries for public documents."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from privret.cli.common import build_config, out
from privret.cli.options import SeedOpt


def generate(
    generator: Annotated[Path, typer.Option(help="directory written by `privret generator train`")],
    data: Annotated[Path, typer.Option("--data", help="BEIR dataset with the public documents")],
    out_dir: Annotated[Path, typer.Option("--out", help="synthetic BEIR dataset to write")],
    documents: Annotated[str, typer.Option(help="'corpus' (all) or a qrels split name (its documents)")] = "train",
    num_queries: Annotated[int, typer.Option(help="queries per document")] = 1,
    top_p: Annotated[float, typer.Option(help="nucleus sampling p")] = 0.8,
    batch_size: Annotated[int, typer.Option()] = 32,
    seed: SeedOpt = 0,
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
    cfg = build_config(GenerateConfig, num_queries=num_queries, top_p=top_p, batch_size=batch_size, seed=seed)
    manifest = generate_synthetic(generator, docs, out_dir, cfg, private_queries=private, resume=resume)
    out.print(f"{manifest['kept']} synthetic queries for {manifest['documents']} documents in {out_dir} "
              f"({manifest['dropped_copies_of_private_queries']} copies of private queries dropped)")
