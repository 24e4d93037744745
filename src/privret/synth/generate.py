"""Write a synthetic BEIR dataset: each public document paired with queries a DP generator wrote.

Privacy: the set carries the generator's ledger (post-processing) as nothing here reads the private log: the
documents are chosen without it (:mod:`privret.synth.documents`) and each output is cut, kept or dropped by
looking at itself and public data only (cut at its first sentence end; dropped when empty, degenerate
(:mod:`privret.synth.queryness`) or on a public ``blocklist``). Dropping outputs equal to private queries is
refused for a DP generator (it would publish which are in the log); only the non-private reference may
(``private_copies``). Query ids are ``syn-<doc>-<k>``, k the sample's index: a gap only marks a drop.

Resumption: finished batches are appended (one ``write``, fsynced) to ``<out>.partial/generated.jsonl``;
batch b is ``documents[b B:(b + 1) B]`` sampled with seed ``seed * 1000003 + b B``, so a resumed run writes
what an uninterrupted one writes; ``meta.json`` there pins the generator, settings and documents. Under
``torchrun`` batch b goes to rank ``b mod W`` (its own file ``generated.rank<r>.jsonl``) and rank 0 merges
the files in document order and writes the dataset and its ledger, renamed into place together.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path


from privret import distributed
from privret.data.beir import BeirDataset, Document, write_beir
from privret.errors import InputError
from privret.io import atomic_path, write_json_atomic
from privret.models.generator import load_trained_generator, saved_examples
from privret.privacy.ledger import PrivacyLedger
from privret.progress import Progress
from privret.runlock import recover_directory
from privret.settings.synthesis import GenerateConfig
from privret.models.decoding import first_sentence
from privret.synth.queryness import degeneracy


def normalise(text: str) -> str:
    return " ".join(text.casefold().split())


def _read_partial(path: Path, known: set[str] | None = None) -> tuple[dict[str, list[str]], int]:
    """Rows written so far and the byte length of the complete ones (a torn tail is cut there)."""
    done: dict[str, list[str]] = {}
    if not path.exists():
        return done, 0
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    good = 0
    for number, line in enumerate(lines, start=1):
        if number == len(lines):  # bytes after the last newline: a torn append, generated again
            break
        good += len(line) + 1
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
            ok = (isinstance(row, dict) and isinstance(row.get("doc_id"), str) and isinstance(row.get("queries"), list)
                  and all(isinstance(q, str) for q in row["queries"]))
        except (UnicodeDecodeError, json.JSONDecodeError):
            ok = False
        if not ok:
            raise InputError("unreadable partial generation (remove the .partial directory to start over)",
                             path=path, line=number)
        if known is not None and row["doc_id"] not in known:
            raise InputError(f"partial generation holds document '{row['doc_id']}', which is not among the documents "
                             "to generate for (another document choice?); remove the .partial directory or use the "
                             "same documents", path=path, line=number)
        done[row["doc_id"]] = row["queries"]
    return done, good


def _check_meta(partial_dir: Path, meta: dict) -> None:
    path = partial_dir / "meta.json"
    if path.exists():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise InputError("unreadable (remove the .partial directory to start over)", path=path) from None
        for key, value in meta.items():
            if saved.get(key) != value:
                raise InputError(f"the interrupted generation used another {key}; resume it with the same settings "
                                 "or remove the .partial directory", path=path, field=key)
    else:
        write_json_atomic(path, meta)


def generate_synthetic(generator_dir: str | Path, documents: list[Document], out_dir: str | Path,
                       cfg: GenerateConfig, *, blocklist: Iterable[str] = (),
                       private_copies: Iterable[str] | None = None, document_selection: PrivacyLedger | None = None,
                       resume: bool = False) -> dict:
    """Generate, cut and drop outputs (see the module docstring), and write the synthetic dataset; returns the manifest.

    ``blocklist``: public texts never to release. ``private_copies``: the private queries, accepted
    only from a non-private generator (its outputs claim no guarantee); with a DP generator it is
    an error, since the filter would make the release depend on the log outside the mechanism.
    ``document_selection``: the ledger of a DP choice of ``documents`` (a second mechanism on the
    same log); the synthetic set's ledger is then the composition of both.
    """
    out_dir = Path(out_dir)
    ledger = PrivacyLedger.load(generator_dir)
    if document_selection is not None:
        ledger = ledger.compose(document_selection)
    if private_copies is not None and ledger.is_private:
        raise InputError("the generator is DP: filtering its outputs by the private queries would leak them "
                         "(only a public blocklist may filter a DP release)", field="private_copies")
    with distributed.main_lock(out_dir, what="synthetic dataset"):
        return _generate(generator_dir, ledger, documents, out_dir, cfg, blocklist=blocklist,
                         private_copies=private_copies, resume=resume)


def _generate(generator_dir, ledger: PrivacyLedger, documents, out_dir: Path, cfg: GenerateConfig, *, blocklist,
              private_copies, resume):
    group = distributed.current()
    partial_dir = out_dir.with_name(out_dir.name + ".partial")
    ids = [d.id for d in documents]
    meta = {"generator": str(Path(generator_dir).absolute()), "generator_ledger": ledger.created_at,
            "config": cfg.recorded(),
            "documents": hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()}
    group.from_main(lambda: _open_partial(out_dir, partial_dir, meta, resume=resume))
    own_file = partial_dir / ("generated.jsonl" if group.main else f"generated.rank{group.rank}.jsonl")
    _, good = _read_partial(own_file, known=set(ids))
    if own_file.exists() and own_file.stat().st_size != good:
        os.truncate(own_file, good)  # cut a torn tail: its documents are generated again
    group.barrier()  # every file is whole before any rank reads the others
    done = _read_partials(partial_dir, set(ids))
    generator = load_trained_generator(generator_dir)
    fd = os.open(own_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        with Progress() as progress:
            task = progress.add_task("generating synthetic queries", total=len(documents), completed=len(done))
            for lo in range(0, len(documents), cfg.batch_size):
                batch = [d for d in documents[lo: lo + cfg.batch_size] if d.id not in done]
                if not batch or not group.owns(lo // cfg.batch_size):
                    continue
                outputs = generator.generate([d.full_text for d in batch], num_queries=cfg.num_queries,
                                             top_p=cfg.top_p, temperature=cfg.temperature,
                                             max_new_tokens=cfg.max_new_tokens, seed=cfg.seed * 1_000_003 + lo,
                                             stop_at_sentence_end=cfg.first_sentence,
                                             repetition_penalty=cfg.repetition_penalty)
                lines = "".join(json.dumps({"doc_id": doc.id, "queries": queries}, ensure_ascii=False) + "\n"
                                for doc, queries in zip(batch, outputs)).encode("utf-8")
                _write_all(fd, lines)  # one batch, one append
                os.fsync(fd)
                progress.advance(task, len(batch))
    finally:
        os.close(fd)
    group.barrier()  # every rank's batches are on disk
    return group.from_main(lambda: _write_dataset(generator_dir, ledger, documents, out_dir, partial_dir, cfg,
                                                  blocklist=blocklist, private_copies=private_copies))


def _open_partial(out_dir: Path, partial_dir: Path, meta: dict, *, resume: bool) -> None:
    """Recover ``out_dir`` after a kill, refuse a finished one (or an interrupted one without ``resume``), and
    create or check the partial directory (its ``meta.json`` pins the settings)."""
    recover_directory(out_dir)
    if out_dir.exists():
        if (out_dir / "manifest.json").is_file():  # finished; its clean-up was cut short
            shutil.rmtree(partial_dir, ignore_errors=True)
        raise InputError("already exists (remove it or choose another output)", path=out_dir)
    if partial_dir.exists() and not resume:
        raise InputError(f"an interrupted generation is in {partial_dir}; resume it to continue", path=out_dir,
                         field="resume")
    partial_dir.mkdir(parents=True, exist_ok=True)
    _check_meta(partial_dir, meta)


def _read_partials(partial_dir: Path, known: set[str]) -> dict[str, list[str]]:
    """The complete rows of every rank's partial file (a torn tail is left out)."""
    done: dict[str, list[str]] = {}
    for path in sorted(partial_dir.glob("generated*.jsonl")):
        done.update(_read_partial(path, known)[0])
    return done


def _write_dataset(generator_dir, ledger: PrivacyLedger, documents, out_dir: Path, partial_dir: Path,
                   cfg: GenerateConfig, *, blocklist, private_copies) -> dict:
    """Merge the partial files in the order of ``documents``, filter, and write the dataset and its ledger."""
    merged = _read_partials(partial_dir, {d.id for d in documents})
    done = {d.id: merged[d.id] for d in documents if d.id in merged}
    blocked = {normalise(q) for q in blocklist}
    copies = {normalise(q) for q in private_copies or ()}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    dropped = {"empty": 0, "blocklisted": 0, "copies_of_private_queries": 0}
    by_id = {d.id: d for d in documents}
    shown = [query for _, query in saved_examples(generator_dir)]
    for doc_id, texts in done.items():
        for k, output in enumerate(texts):
            text, degenerate = _formatted(output, by_id[doc_id], cfg, shown)
            if not text.strip():
                dropped["empty"] += 1
            elif degenerate is not None:
                dropped[f"degenerate_{degenerate}"] = dropped.get(f"degenerate_{degenerate}", 0) + 1
            elif normalise(text) in blocked:
                dropped["blocklisted"] += 1
            elif normalise(text) in copies:
                dropped["copies_of_private_queries"] += 1
            else:
                qid = f"syn-{doc_id}-{k}"
                queries[qid] = text
                qrels[qid] = {doc_id: 1}
    if private_copies is None:  # a DP release: nothing was compared with private text, so nothing to count
        del dropped["copies_of_private_queries"]
    manifest = {"generator": str(generator_dir), "ledger": ledger.model_dump(mode="json"),
                "config": cfg.model_dump(mode="json"), "documents": len(done),
                "generated": sum(len(t) for t in done.values()), "kept": len(queries),
                **{f"dropped_{reason}": count for reason, count in dropped.items()}}
    corpus = {doc_id: by_id[doc_id] for doc_id in done}
    with atomic_path(out_dir) as staged:  # dataset and ledger appear together
        write_beir(staged, BeirDataset(corpus=corpus, queries=queries, qrels={"train": qrels}), manifest=manifest)
        ledger.save(staged)
    shutil.rmtree(partial_dir, ignore_errors=True)
    return manifest


def _formatted(output: str, document: Document, cfg: GenerateConfig, shown: list[str]) -> tuple[str, str | None]:
    """``output`` as released (cut at its first sentence end with ``cfg.first_sentence``) and why it is dropped as
    degenerate (:func:`~privret.synth.queryness.degeneracy`; None: kept, or ``cfg.drop_degenerate`` off). Reads
    the output, its public document and the public example queries the prompt ``shown`` only."""
    text = first_sentence(output) if cfg.first_sentence else output.strip()
    return text, degeneracy(text, document.title, document.text, shown) if cfg.drop_degenerate else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
