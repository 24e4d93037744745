"""The synthetic-query route from Python: DP fine-tuning of a query generator, then queries for public documents.

Both call what the command line calls (:func:`privret.train.generator.train_generator`,
:func:`privret.synth.generate.generate_synthetic`) with settings validated by the same pydantic models. Privacy
assumption: the documents queries are written for are public; the generator's (epsilon, delta) covers the pairs it
was trained on, and its queries carry that guarantee by post-processing.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from privret.api.workspace import budget_policy, settings_model, workspace
from privret.data.beir import Document, load_beir
from privret.data.sources import as_corpus, training_pairs
from privret.errors import InputError
from privret.privacy.budget import BudgetPolicy, dataset_id
from privret.privacy.ledger import PrivacyLedger
from privret.settings.synthesis import GenerateConfig
from privret.settings.training import GeneratorTrainConfig
from privret.synth.generate import generate_synthetic
from privret.train.generator import train_generator


@dataclass
class TrainedGenerator:
    """A fine-tuned generator on disk (``path``) and its ``ledger``; a temporary ``path`` (no ``out_dir`` given) is
    removed by :meth:`close`, at the end of a ``with`` block, or when the object is garbage-collected."""

    path: Path
    ledger: PrivacyLedger
    _scratch: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    def close(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()

    def __enter__(self) -> TrainedGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class SyntheticQueries:
    """Queries a generator wrote: ``pairs`` (``{query, doc_id}`` records), the public documents they point at
    (``corpus``), the generator's ``ledger`` they carry and the generation's ``manifest`` (counts, settings)."""

    pairs: list[dict[str, str]]
    corpus: dict[str, Document]
    ledger: PrivacyLedger
    manifest: dict


def train_dp_generator(model: str, pairs, corpus=None, *, epsilon: float, out_dir: str | Path | None = None,
                       split: str = "train", budget: BudgetPolicy | None = None, dataset_name: str | None = None,
                       resume: bool = False, warm_start: str | Path | None = None,
                       public_examples: list[tuple[str, str]] | None = None, **settings) -> TrainedGenerator:
    """DP fine-tune the query generator ``model`` on document -> query ``pairs``.

    Parameters
    ----------
    model : str
        A registry name (``smollm2-135m``), a Hugging Face id or a path: the public starting model.
    pairs, corpus, split, out_dir, budget, dataset_name, resume
        As in :func:`privret.api.retriever.train_dp_retriever`; without ``out_dir`` the generator is kept in a
        temporary directory for as long as the returned object (``close()`` removes it).
    epsilon : float
        Target epsilon (``inf``: the non-private reference).
    warm_start : path, optional
        A generator made from public data only, to start from.
    public_examples : list of (document, query), optional
        Public pairs the prompt shows (``start="prompted"``, the default); privret's generic ones otherwise.
    **settings
        Fields of :class:`~privret.settings.training.GeneratorTrainConfig`.

    Privacy: (epsilon, delta)-DP for one privacy unit of ``pairs`` (DP-Adam over Poisson-sampled units).
    """
    training, data_hash = training_pairs(pairs, corpus, split=split)
    cfg = settings_model(GeneratorTrainConfig, model=model, epsilon=epsilon, **settings)
    if out_dir is None and resume:
        raise InputError("resuming continues the run saved in out_dir; give out_dir", field="resume")
    scratch = tempfile.TemporaryDirectory(prefix="privret-") if out_dir is None else None
    out = Path(out_dir) if out_dir is not None else Path(scratch.name) / "generator"
    try:
        train_generator(training, out, cfg, data_hash=data_hash, dataset_id=dataset_id(training, dataset_name),
                        resume=resume, budget=budget_policy(budget, dataset_name), warm_start=warm_start,
                        public_examples=public_examples)
    except BaseException:
        if scratch is not None:
            scratch.cleanup()
        raise
    return TrainedGenerator(path=out, ledger=PrivacyLedger.load(out), _scratch=scratch)


def generate_queries(generator: TrainedGenerator | str | Path, documents, *, out_dir: str | Path | None = None,
                     blocklist=(), resume: bool = False, **settings) -> SyntheticQueries:
    """Sample queries for the public ``documents`` with a trained ``generator``; return them in memory.

    Parameters
    ----------
    generator : TrainedGenerator or path
        What :func:`train_dp_generator` returned, or a generator directory ``privret generator train`` wrote.
    documents : path, dict or list
        Public documents, as a corpus (:func:`privret.data.sources.as_corpus`); every one gets queries.
    out_dir : path, optional
        Also write the synthetic BEIR dataset there (``resume=True`` continues an interrupted generation).
    blocklist : iterable of str
        Public texts never to release (outputs equal to one are dropped).
    **settings
        Fields of :class:`~privret.settings.synthesis.GenerateConfig` (``num_queries``, ``top_p``, ``seed``, ...).

    Privacy: post-processing of the generator; the queries carry its ledger.
    """
    location = generator.path if isinstance(generator, TrainedGenerator) else Path(generator)
    docs = list(as_corpus(documents).values())
    cfg = settings_model(GenerateConfig, **settings)
    with workspace(out_dir, resume=resume, name="synthetic") as (out, _):
        manifest = generate_synthetic(location, docs, out, cfg, blocklist=list(blocklist), resume=resume)
        written = load_beir(out, splits=["train"])
        pairs = [{"query": written.queries[query_id], "doc_id": doc_id}
                 for query_id, judged in written.qrels["train"].items() for doc_id in judged]
        return SyntheticQueries(pairs=pairs, corpus=written.corpus, ledger=PrivacyLedger.load(out), manifest=manifest)
