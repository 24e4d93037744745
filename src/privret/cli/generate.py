"""``privret synth generate``: synthetic queries for public documents."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.cli.common import build_config, given_values, out
from privret.cli.options import config_file_option, device_option

ConfigOpt = config_file_option("GenerateConfig")


@device_option
def generate(
    model: Annotated[Path, typer.Option(
        "--model", help="the generator to sample: a directory written by `privret generator train`, `train-dp` or "
                        "`prompt`")],
    data: Annotated[Path, typer.Option("--data", help="BEIR dataset with the public documents")],
    out_dir: Annotated[Path, typer.Option("--out", help="synthetic BEIR dataset to write")],
    documents: Annotated[str, typer.Option(
        help="'corpus' (every document of --data), a file of public document ids (one per line), or a "
             "directory written by `privret data select-documents` (DP choice; its ledger is composed in)")]
    = "corpus",
    sample: Annotated[Optional[int], typer.Option(help="keep a random subset of this many documents")] = None,
    sample_seed: Annotated[int, typer.Option(help="seed of --sample")] = 0,
    blocklist: Annotated[Optional[Path], typer.Option(
        help="public texts (one per line) never to release; outputs equal to one are dropped")] = None,
    num_queries: Annotated[int, typer.Option(help="queries per document")] = 1,
    top_p: Annotated[float, typer.Option(help="nucleus sampling p")] = 0.8,
    batch_size: Annotated[int, typer.Option()] = 32,
    seed: Annotated[int, typer.Option(help="seed of the sampling (each batch's own seed derives from it, so a "
                                           "resumed generation writes what an uninterrupted one writes)")] = 0,
    resume: Annotated[bool, typer.Option(help="continue an interrupted generation")] = False,
    config: ConfigOpt = None,
) -> None:
    """Sample synthetic queries for public documents; writes a BEIR dataset carrying the ledger.

    Never reads private queries: the documents come from a public source or a DP selection, and
    outputs are dropped only by the public --blocklist and by checks of the output alone (cut at its first sentence
    end, degenerate outputs dropped: the fields first_sentence and drop_degenerate of --config). Sampling is nucleus
    (--top-p) with a repetition penalty on the tokens each output has already written, never the prompt's (the
    field repetition_penalty of --config, default 1.2; 1 = off)."""
    from privret.data.beir import load_corpus
    from privret.privacy.ledger import PrivacyLedger
    from privret.settings.synthesis import DocumentChoice, GenerateConfig
    from privret.synth.documents import SELECTED_IDS_FILE, read_document_ids, sampled
    from privret.synth.generate import generate_synthetic

    corpus = load_corpus(data / "corpus.jsonl")
    selection = None
    if documents == "corpus":
        ids = list(corpus)
    elif Path(documents).is_dir():  # a DP selection: its ids, and its ledger to compose
        selection = PrivacyLedger.load(documents)
        ids = read_document_ids(Path(documents) / SELECTED_IDS_FILE, corpus)
    else:
        ids = read_document_ids(Path(documents), corpus)
    docs = [corpus[d] for d in sampled(ids, build_config(DocumentChoice, sample=sample, seed=sample_seed))]
    blocked = _read_lines(blocklist) if blocklist is not None else []
    cfg = build_config(GenerateConfig, config_file=config, **given_values(num_queries=num_queries, top_p=top_p,
                                                                          batch_size=batch_size, seed=seed))
    manifest = generate_synthetic(model, docs, out_dir, cfg, blocklist=blocked, document_selection=selection,
                                  resume=resume)
    out.print(f"{manifest['kept']} synthetic queries for {manifest['documents']} documents in {out_dir} "
              f"({manifest['dropped_empty']} empty and {manifest['dropped_blocklisted']} blocklisted outputs dropped; "
              f"{PrivacyLedger.load(out_dir).summary()})")


def _read_lines(path: Path) -> list[str]:
    from privret.errors import InputError

    try:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        raise InputError("not found", path=path, field="--blocklist") from None
    except UnicodeDecodeError:
        raise InputError("not valid UTF-8", path=path, field="--blocklist") from None
