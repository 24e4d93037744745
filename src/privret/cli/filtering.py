"""``privret synth filter``: round-trip consistency filter of a synthetic set with a public encoder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.cli.common import build_config, out
from privret.cli.options import ENCODER_HELP, device_option


@device_option
def filter_synthetic(
    synthetic: Annotated[Path, typer.Option(help="synthetic BEIR dataset written by `privret synth generate`")],
    data: Annotated[Path, typer.Option("--data", help="BEIR dataset whose (public) corpus is searched")],
    out_dir: Annotated[Path, typer.Option("--out", help="filtered synthetic BEIR dataset to write")],
    encoder: Annotated[str, typer.Option(help=f"public {ENCODER_HELP}; never one trained on the private data")]
    = "minilm-l6",
    top_k: Annotated[int, typer.Option(help="keep (q, d) when d is among q's top k documents")] = 20,
    batch_size: Annotated[int, typer.Option()] = 64,
    cache_dir: Annotated[Optional[Path], typer.Option(
        help="reuse or store the encoder's corpus embeddings here (a .npy per encoder weights and corpus)")] = None,
) -> None:
    """Keep the synthetic pairs whose document a public encoder ranks in the query's top k (same ledger)."""
    from privret.data.beir import load_corpus
    from privret.synth.filter import filter_round_trip
    from privret.settings.synthesis import RoundTripFilterConfig

    cfg = build_config(RoundTripFilterConfig, encoder=encoder, top_k=top_k, batch_size=batch_size)
    manifest = filter_round_trip(synthetic, load_corpus(data / "corpus.jsonl"), out_dir, cfg, cache_dir=cache_dir)
    out.print(f"kept {manifest['kept']} of {manifest['queries_in']} synthetic queries in {out_dir} "
              f"(top {top_k} of {encoder}); ledger unchanged")
