"""Training a SentenceTransformer retriever from Python: with direct DP, or without DP for the baseline.

Both call the trainers the command line calls (:func:`privret.train.dp_retriever.train_dp_retriever`,
:func:`privret.train.retriever.train_retriever`) with settings validated by the same pydantic models
(:class:`~privret.settings.training.DPRetrieverConfig`, :class:`~privret.settings.training.RetrieverTrainConfig`).
Privacy assumption: the corpus is public; the pairs are the private log, protected per privacy unit by DP training.
"""

from __future__ import annotations

from pathlib import Path

from privret.api.synthetic import SyntheticQueries
from privret.api.workspace import LEDGER_ATTRIBUTE, budget_policy, model_location, settings_model, workspace
from privret.data.sources import training_pairs
from privret.errors import InputError
from privret.models.encoder import load_encoder
from privret.privacy.budget import BudgetPolicy, dataset_id
from privret.privacy.ledger import PrivacyLedger, has_ledger
from privret.settings.training import DPRetrieverConfig, RetrieverTrainConfig
from privret.train import dp_retriever, retriever


def train_dp_retriever(model, pairs, corpus=None, *, epsilon: float, out_dir: str | Path | None = None,
                       split: str = "train", budget: BudgetPolicy | None = None, dataset_name: str | None = None,
                       resume: bool = False, cache_dir: str | Path | None = None, **settings):
    """Train ``model`` on the private ``pairs`` with direct DP; return ``(model, ledger)``.

    Parameters
    ----------
    model : SentenceTransformer or str
        The public starting model: an instance, a registry name (``minilm-l6``), a Hugging Face id or a path.
    pairs : path, list or datasets.Dataset
        A BEIR directory (its ``split``), a pairs JSONL file, ``(query, doc_id)`` tuples or
        ``{query, doc_id | doc, user_id}`` records.
    corpus : path, dict or list, optional
        The public corpus that the pairs' document ids name and public negatives are drawn from (a BEIR
        directory brings its own).
    epsilon : float
        Target epsilon; delta defaults to 1/(2n), n the number of privacy units.
    out_dir : path, optional
        Where the model, its ledger and the checkpoints are written; without it nothing is kept (a temporary
        directory, removed). ``resume=True`` continues an interrupted run there.
    budget, dataset_name : optional
        The release is recorded in the budget registry (and checked against its cap) only when either is given.
    **settings
        Fields of :class:`~privret.settings.training.DPRetrieverConfig` (``method``, ``batch_size``, ...); its
        defaults otherwise. A bad name or value raises :class:`~privret.errors.InputError` naming it.

    Privacy: (epsilon, delta)-DP for one privacy unit (``unit``) of ``pairs``; the corpus is public.
    """
    training, data_hash = training_pairs(pairs, corpus, split=split)
    has_public = corpus is not None or _is_dir(pairs)  # the corpus the doc_ids name; inline documents are left out
    with workspace(out_dir, resume=resume, name="retriever") as (out, scratch):
        cfg = settings_model(DPRetrieverConfig, model=model_location(model, scratch), epsilon=epsilon, **settings)
        _check_dp_settings(cfg, settings, has_public, cache_dir)
        dp_retriever.train_dp_retriever(
            training, out, cfg, data_hash=data_hash, dataset_id=dataset_id(training, dataset_name),
            public_corpus=training.corpus if has_public else None, resume=resume,
            budget=budget_policy(budget, dataset_name), embedding_cache=cache_dir)
        return _trained(out)


def train_retriever(model, pairs, corpus=None, *, out_dir: str | Path | None = None, split: str = "train",
                    public: bool = False, **settings):
    """Train ``model`` on ``pairs`` without DP (in-batch softmax); return ``(model, ledger)``.

    Parameters
    ----------
    model, pairs, corpus, split, out_dir
        As in :func:`train_dp_retriever`; ``pairs`` may also be the :class:`~privret.api.synthetic.SyntheticQueries`
        of :func:`~privret.api.synthetic.generate_queries` or a synthetic set's directory, whose ledger the
        model then carries (post-processing).
    public : bool
        The pairs hold no private query (the caller's statement): the model gets a public, epsilon-0 ledger.
    **settings
        Fields of :class:`~privret.settings.training.RetrieverTrainConfig`.

    Privacy: none for private pairs (epsilon = inf: a reference); a synthetic set's guarantee carries over.
    """
    synthetic = None
    if isinstance(pairs, SyntheticQueries):
        pairs, corpus, synthetic = pairs.pairs, pairs.corpus, pairs.ledger
    elif _is_dir(pairs) and has_ledger(pairs):
        synthetic = PrivacyLedger.load(pairs)
    training, data_hash = training_pairs(pairs, corpus, split=split)
    with workspace(out_dir, resume=False, name="retriever") as (out, scratch):
        cfg = settings_model(RetrieverTrainConfig, model=model_location(model, scratch), **settings)
        retriever.train_non_private(training, out, cfg, data_hash=data_hash, synthetic=synthetic, public=public)
        return _trained(out)


def _check_dp_settings(cfg: DPRetrieverConfig, given: dict, has_public: bool, cache_dir) -> None:
    """Refuse what the command line refuses: a setting ``cfg``'s method ignores, public-negatives without a public
    corpus, an embedding cache without hard negatives."""
    unused = cfg.unused(given)
    if unused:
        raise InputError(f"is not used by method {cfg.method} with these settings", field=unused[0])
    if cfg.method == "public-negatives" and not has_public:
        raise InputError("public-negatives draws its negatives from a public corpus: give corpus (documents given "
                         "inline with the pairs are private)", field="corpus")
    if cache_dir is not None and not cfg.hard_negatives:
        raise InputError("keeps the embeddings hard negatives are mined from; without them nothing is mined",
                         field="cache_dir")


def _trained(out: Path) -> tuple:
    """(the SentenceTransformer saved in ``out``, carrying its ledger as :data:`LEDGER_ATTRIBUTE`; the ledger as its
    file says it, :meth:`~privret.privacy.ledger.PrivacyLedger.published`)."""
    model, ledger = load_encoder(str(out)), PrivacyLedger.load(out)
    setattr(model, LEDGER_ATTRIBUTE, ledger)
    return model, ledger


def _is_dir(value) -> bool:
    return isinstance(value, (str, Path)) and Path(value).is_dir()
