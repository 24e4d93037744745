"""The model card (``README.md``, Hugging Face format) of a retriever privret trained.

sentence-transformers saves the base model's card with the weights; that card describes someone
else's training. :func:`write_model_card` replaces it with one built from what privret recorded in
the same directory, so the directory can be published as it is:

* ``privacy_ledger.json``: the base model, (epsilon, delta), unit and accountant, and what the
  guarantee covers; the training data's identity (keyed commitments of ``data_hash`` and
  ``dataset_id``, :mod:`privret.privacy.commitment`, and the pair count) only for a model without a
  DP guarantee: a DP model's card says the data was the private log and no more;
* ``train_config.json`` (non-private training) or the DP trainer's settings file, when present;
* ``evaluations.json``: figures added by :func:`record_evaluation` after each evaluation (never a DP model's
  figures on the data it was trained on).

The card is rendered from these files alone and rewritten atomically whenever one changes.
"""

from __future__ import annotations

import json
from pathlib import Path

from privret import __version__
from privret.io import write_json_atomic, write_text_atomic
from privret.models.registry import HUB_IDS
from privret.privacy.commitment import commit
from privret.privacy.ledger import PrivacyLedger, format_epsilon, has_ledger

CARD_FILE = "README.md"
EVALUATIONS_FILE = "evaluations.json"
SETTINGS_FILES = {"train_config.json": "Training settings", "dp_mechanism.json": "DP mechanism",
                  "private_selection.json": "DP choice among candidate models",
                  "interpolation.json": "Interpolation with the base model (WiSE-FT, post-processing)"}


def guarantee_text(ledger: PrivacyLedger) -> str:
    """One paragraph: what the ledger's (epsilon, delta) says about these weights, in words."""
    if ledger.is_public:
        return ("No private data was used: the weights depend only on public data "
                f"(mechanism `{ledger.mechanism}`), so no privacy guarantee is needed.")
    if not ledger.is_private:
        return ("**No privacy guarantee.** The weights were trained on private data without differential privacy "
                "(a non-private reference); do not publish them if the training data is private.")
    first, *rest = ledger.mechanism.split(" + ")
    kind = {"dp-sgd": "synthetic data from a DP generator (post-processing)",
            "exponential-mechanism": "a DP choice among public models scored on the private log"}.get(
        first, f"direct DP training (`{first}`)")
    if "laplace-partition-selection" in rest:
        kind += ", whose documents were chosen by a DP partition selection"
    if "exponential-mechanism" in rest:
        kind += ", then a DP choice among candidate models scored on the private log (exponential mechanism)"
    if any(part.part is not None for part in ledger.parts or [ledger]):
        kind += (" (one or more of these read only one part of the log, split by a public salted hash of each unit's "
                 "key; mechanisms on complementary parts count in parallel under add/remove neighbours: "
                 f"{ledger.composition or ledger.part.describe()})")
    return (f"({ledger.epsilon:.4g}, {ledger.delta:.3g})-differential privacy with respect to one privacy unit "
            f"(`{ledger.unit}`: {ledger.unit_definition or ledger.unit}) of the private log, through {kind}. "
            "The guarantee covers the weights and anything computed from them; it does not cover the public "
            "corpus, the number of units (treated as public), or other releases made from the same log, whose "
            "budgets add up (see privret's docs/privacy.md).")


def _front_matter(ledger: PrivacyLedger) -> str:
    tags = ["sentence-transformers", "sentence-similarity", "dense-retrieval", "privret",
            "public-data" if ledger.is_public else "differential-privacy" if ledger.is_private else "non-private"]
    lines = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
             f"base_model: {HUB_IDS.get(ledger.model, ledger.model)}", "tags:", *(f"- {t}" for t in tags), "---"]
    return "\n".join(lines)


def _table(rows: list[tuple[str, str]]) -> str:
    return "\n".join(["| field | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def render_model_card(directory: Path) -> str:
    """The card's Markdown for the retriever in ``directory`` (see the module docstring)."""
    ledger = PrivacyLedger.load(directory)
    privacy = [("mechanism", f"`{ledger.mechanism}`"), ("epsilon", format_epsilon(ledger.epsilon, digits=4)), ("delta", f"{ledger.delta:.3g}"),
               ("unit", f"`{ledger.unit}`"), ("accountant", f"`{ledger.accountant}`"),
               ("units in the private log (public by assumption)" if ledger.part is None else
                f"units in the {ledger.part.describe()} of the private log it read (public by assumption)",
                str(ledger.n_units))]
    if ledger.is_public:  # it read no private log: say what public data it read instead
        privacy = privacy[:-1]
        data = [("training data", "public data only (sha256 below, unkeyed: the data is public)"),
                ("public data sha256", f"`{ledger.provenance.get('public_data_hash', '-')}`"),
                ("pairs", str(ledger.n_pairs))]
    elif ledger.is_private:
        data = [("training data", "the private log (privacy_ledger.json names it only by a keyed commitment, "
                                  "which reveals nothing without the key of the privret installation that "
                                  "trained this model, and withholds its pair count)")]
    else:
        data = [("training data (keyed commitment of its sha256)", f"`{ledger.data_hash}`" if ledger.data_hash else "-"),
                ("pairs", str(ledger.n_pairs)),
                ("dataset id (budget registry)", f"`{ledger.dataset_id}`" if ledger.dataset_id else "-")]
    sections = [_front_matter(ledger), "", "# Dense retriever trained with privret", "",
                f"A dual encoder fine-tuned from `{HUB_IDS.get(ledger.model, ledger.model)}` by privret {__version__} "
                "(mean pooling, cosine similarity; load it with `SentenceTransformer(path)`).", "",
                "## Privacy", "", guarantee_text(ledger), "", _table(privacy), "",
                "## Training data", "", _table(data)]
    for name, heading in SETTINGS_FILES.items():
        if (directory / name).is_file():
            settings = json.loads((directory / name).read_text())
            sections += ["", f"## {heading}", "", _table([(k, f"`{v}`") for k, v in settings.items()])]
    evaluations = _evaluations(directory)
    if evaluations:
        sections += ["", "## Evaluation", "", "| data | split | encoded in | queries | NDCG@10 | Recall@100 | MRR@10 |",
                     "|---|---|---|---|---|---|---|"]
        sections += [f"| {e['data']} | {e['split']} | {e.get('precision', '-')} | {e['metrics'].get('queries', '-')} | "
                     f"{e['metrics']['ndcg@10']:.4f} | {e['metrics']['recall@100']:.4f} | "
                     f"{e['metrics']['mrr@10']:.4f} |" for e in evaluations]
    return "\n".join(sections) + "\n"


def _evaluations(directory: Path) -> list[dict]:
    path = directory / EVALUATIONS_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def write_model_card(directory: str | Path) -> Path:
    """Render and write ``directory/README.md`` atomically; returns its path."""
    directory = Path(directory)
    write_text_atomic(directory / CARD_FILE, render_model_card(directory))
    return directory / CARD_FILE


def record_evaluation(directory: str | Path, *, data: str, split: str, metrics: dict[str, float],
                      precision: str, data_ids: tuple[str, ...] = ()) -> bool:
    """Add (or replace) the figures of one evaluation to a privret retriever's card, with the number format the
    encodings ran in (``precision``: :func:`privret.models.device.precision_label`); True when recorded.

    Evaluations are keyed by (data, split); a directory without a privret ledger (a public model)
    is left untouched. ``data_ids``: identities of the evaluated data as a training run would name it (the split's
    :func:`privret.data.beir.dataset_hash` and its content key :func:`privret.privacy.budget.dataset_id`); when one
    is the data a DP model was trained on (its ledger's ``data_hash`` or ``dataset_id``), nothing is recorded,
    since the card may be published and these figures of the private log carry no DP guarantee. A log the run
    named otherwise (``--dataset-name``, a pairs file with other texts) is not recognised."""
    directory = Path(directory)
    if not has_ledger(directory):
        return False
    ledger = PrivacyLedger.load(directory)
    trained_on = {ledger.data_hash, ledger.dataset_id} - {""}
    if ledger.is_private and not ledger.is_public and any(commit(i) in trained_on for i in data_ids):
        return False
    kept = [e for e in _evaluations(directory) if (e["data"], e["split"]) != (data, split)]
    write_json_atomic(directory / EVALUATIONS_FILE,
                      [*kept, {"data": data, "split": split, "precision": precision, "metrics": metrics}])
    write_model_card(directory)
    return True
