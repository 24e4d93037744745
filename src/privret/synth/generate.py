"""Write a synthetic BEIR dataset: each public document paired with queries a DP generator wrote.

By the post-processing property of DP, the synthetic set carries the generator's guarantee
(its ledger is copied into ``manifest.json``). It never contains an original query: outputs
equal to a private query after normalisation (case, whitespace) are dropped and counted.

Generation appends finished batches to ``<out>.partial/generated.jsonl`` (flushed and fsynced),
so an interrupted run resumes where it stopped; the dataset directory appears only when done.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from privret.data.beir import BeirDataset, Document, write_beir
from privret.errors import InputError
from privret.models.generator import load_trained_generator
from privret.privacy.ledger import PrivacyLedger
from privret.progress import Progress


class GenerateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_queries: int = Field(1, gt=0, description="queries per document")
    top_p: float = Field(0.8, gt=0, le=1, allow_inf_nan=False)
    temperature: float = Field(1.0, gt=0, allow_inf_nan=False)
    max_new_tokens: int = Field(48, gt=0)
    batch_size: int = Field(32, gt=0)
    seed: int = 0


def normalise(text: str) -> str:
    return " ".join(text.casefold().split())


def _read_partial(path: Path) -> dict[str, list[str]]:
    done: dict[str, list[str]] = {}
    if not path.exists():
        return done
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break  # a torn last line from a crash: regenerate from here
            done[row["doc_id"]] = row["queries"]
    return done


def generate_synthetic(generator_dir: str | Path, documents: list[Document], out_dir: str | Path,
                       cfg: GenerateConfig, *, private_queries: set[str], resume: bool = False) -> dict:
    """Generate, filter and write the synthetic dataset; returns the manifest."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise InputError("already exists (remove it or choose another output)", path=out_dir)
    partial_dir = out_dir.with_name(out_dir.name + ".partial")
    if partial_dir.exists() and not resume:
        raise InputError(f"an interrupted generation is in {partial_dir}; pass --resume to continue it",
                         path=out_dir)
    partial_dir.mkdir(parents=True, exist_ok=True)
    ledger = PrivacyLedger.load(generator_dir)
    partial_file = partial_dir / "generated.jsonl"
    done = _read_partial(partial_file)
    # keep only complete lines (a torn tail is dropped and regenerated)
    with open(partial_file, "w", encoding="utf-8") as f:
        for doc_id, queries in done.items():
            f.write(json.dumps({"doc_id": doc_id, "queries": queries}, ensure_ascii=False) + "\n")
    todo = [d for d in documents if d.id not in done]
    generator = load_trained_generator(generator_dir)
    with Progress() as progress, open(partial_file, "a", encoding="utf-8") as sink:
        task = progress.add_task("generating synthetic queries", total=len(documents), completed=len(done))
        for lo in range(0, len(todo), cfg.batch_size):
            batch = todo[lo: lo + cfg.batch_size]
            outputs = generator.generate([d.full_text for d in batch], num_queries=cfg.num_queries, top_p=cfg.top_p,
                                         temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                                         seed=cfg.seed * 1_000_003 + len(done) + lo)
            for doc, queries in zip(batch, outputs):
                sink.write(json.dumps({"doc_id": doc.id, "queries": queries}, ensure_ascii=False) + "\n")
                done[doc.id] = queries
            sink.flush()
            os.fsync(sink.fileno())
            progress.advance(task, len(batch))

    private = {normalise(q) for q in private_queries}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    dropped_copies = dropped_empty = 0
    by_id = {d.id: d for d in documents}
    for doc_id, texts in done.items():
        for k, text in enumerate(texts):
            if not text.strip():
                dropped_empty += 1
            elif normalise(text) in private:
                dropped_copies += 1
            else:
                qid = f"syn-{doc_id}-{k}"
                queries[qid] = text
                qrels[qid] = {doc_id: 1}
    manifest = {"generator": str(generator_dir), "ledger": ledger.model_dump(mode="json"),
                "config": cfg.model_dump(mode="json"), "documents": len(done),
                "generated": sum(len(t) for t in done.values()), "kept": len(queries),
                "dropped_copies_of_private_queries": dropped_copies, "dropped_empty": dropped_empty}
    corpus = {doc_id: by_id[doc_id] for doc_id in done}
    write_beir(out_dir, BeirDataset(corpus=corpus, queries=queries, qrels={"train": qrels}), manifest=manifest)
    ledger.save(out_dir)
    shutil.rmtree(partial_dir, ignore_errors=True)
    return manifest
