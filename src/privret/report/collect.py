"""Read a run directory (the layout of :mod:`privret.pipeline`) into plain data for the report.

Required: at least one ``metrics.json`` row. Shown when present: ``zero_shot/`` and ``original/`` (the references);
``per_query.json`` beside a ``metrics.json`` (the paired bootstrap interval against zero-shot,
:mod:`privret.evaluate.statistics`); ``eps-<e>/`` (metrics, the generator's ledger, ``synthetic/`` examples,
query-ness and manifest, ``timing.json``, ``mauve.json``); ``direct-<method>-eps-<e>[-selected]/`` (metrics and ledger); ``similarity.json``,
``canaries.json`` or ``canaries/canaries.json``; any top-level JSON shaped like ``privret evaluate retrieval --datasets``
output; ``config.json``. See docs/report.md.

A file that is present but unreadable is an :class:`InputError` naming it: a report that silently drops a row
would mislead.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from privret.errors import InputError
from privret.evaluate.statistics import PER_QUERY_FILE, Versus, versus_bar, versus_zero_shot
from privret.run_layout import (CONFIG_FILE, DIRECT_ROW_PREFIX, DP_ROW_PREFIX, FILTERED_SUFFIX, GENERATOR, MAUVE_FILE,
                                METRICS_FILE, ORIGINAL, PUBLIC_ROWS, RETRIEVER, SELECTED_SUFFIX, SUMMARY_FILE,
                                SYNTHETIC, TIMING_FILE, ZERO_SHOT)
from privret.privacy.ledger import LEDGER_FILE, format_epsilon
from privret.synth.queryness import Queryness, synthetic_queryness

EPS_DIR = re.compile(rf"^{re.escape(DP_ROW_PREFIX)}(?P<eps>inf|[0-9.eE+-]+?)"
                      rf"(?P<suffix>{re.escape(FILTERED_SUFFIX)}|{re.escape(SELECTED_SUFFIX)})?$")
_DIRECT_DIR = re.compile(rf"^{re.escape(DIRECT_ROW_PREFIX)}(?P<method>.+)-eps-(?P<eps>inf|[0-9.eE+-]+?)"
                         rf"(?P<suffix>{re.escape(SELECTED_SUFFIX)})?$")


@dataclass
class Row:
    """One retriever: what it was trained on, its metrics, and the ledger that covers it."""

    key: str  # directory name
    label: str
    method: str  # "zero-shot", "original", "public-prompted", "public-pairs", "dp-synthetic", "direct-<method>"
    epsilon: float | None  # None: the public encoder (zero-shot); 0: a row made without private data
    metrics: dict
    ledger: dict | None = None
    ledger_source: str | None = None
    timing: dict = field(default_factory=dict)
    per_query: dict[str, float] | None = None  # NDCG@10 per test query, when the run kept it
    grid_epsilon: float | None = None  # a DP row's epsilon in the run's grid (its directory name); None otherwise
    queryness: Queryness | None = None  # of the synthetic set it trained on, when it has one
    mauve: float | None = None  # that set's MAUVE against the private queries (mauve.json; not DP), when measured

    @property
    def is_reference(self) -> bool:
        """A line to compare with, not a point of a method: zero-shot, the original pairs, the rows without
        private data."""
        return self.method in ("zero-shot", "original", *PUBLIC_ROWS)


@dataclass
class Examples:
    """Synthetic queries of a few documents, per epsilon label; originals only when asked for."""

    documents: list[dict]  # {id, title, text}
    synthetic: dict[str, dict[str, list[str]]]  # eps label -> doc id -> queries
    originals: dict[str, list[str]] | None  # doc id -> private queries (only with show_private)
    hidden_labels: list[str]  # eps labels whose examples were withheld (non-private generator)


@dataclass
class RunData:
    run_dir: Path
    name: str
    config: dict
    rows: list[Row]
    similarity: list[dict]
    canaries: dict | None
    zero_shot_datasets: list[dict]
    examples: Examples | None
    notes: list[str] = field(default_factory=list)
    versus: dict[str, Versus] = field(default_factory=dict)  # row key -> retention and CI against zero-shot
    bar: str | None = None  # the key of the epsilon = 0 bar (the best row without private data), if any
    versus_bar: dict[str, Versus] = field(default_factory=dict)  # row key -> difference and CI against the bar
    # show the wall time of the stages that read the private log and its pair counts (no guarantee covers them)
    private_timings_and_counts: bool = False


def read_json(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("not valid UTF-8", path=path) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"malformed JSON ({err.msg})", path=path, line=err.lineno) from None


def parse_eps(text: str) -> float:
    return math.inf if text in ("inf", "Infinity") else float(text)


def _metrics(path: Path) -> dict:
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("ndcg@10"), (int, float)):
        raise InputError("expected an object with a numeric 'ndcg@10'", path=path, field="ndcg@10")
    return data


def _ledger(*candidates: Path) -> tuple[dict | None, str | None]:
    for directory in candidates:
        path = directory / LEDGER_FILE
        if path.is_file():
            data = read_json(path)
            if not isinstance(data, dict) or "epsilon" not in data:
                raise InputError("not a privacy ledger (no 'epsilon')", path=path, field="epsilon")
            data = {**data, "epsilon": _float(data["epsilon"]), "delta": _float(data.get("delta"))}
            return data, str(path)
    return None, None


def method_label(method: str) -> str:
    if method == "dp-synthetic":
        return "DP synthetic queries"
    if method == "dp-synthetic-filtered":
        return "DP synthetic queries, round-trip filtered"
    if method == "dp-synthetic-selected":
        return "DP synthetic queries, retriever chosen with DP on the private log"
    if method.startswith("direct-") and method.endswith(SELECTED_SUFFIX):
        return f"direct DP ({method.removeprefix('direct-').removesuffix(SELECTED_SUFFIX)}), chosen with DP on " \
               "held-out units"
    if method.startswith("direct-"):
        return f"direct DP ({method.removeprefix('direct-')})"
    return method


def _float(value):
    if value is None:
        return None
    if isinstance(value, str):
        return parse_eps(value) if value in ("inf", "Infinity") else float(value)
    return float(value)


def collect(run_dir: str | Path, *, show_private_queries: bool = False, show_private_timings_and_counts: bool = False,
            examples: int = 3) -> RunData:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError("run directory not found", path=run_dir)
    config = read_json(run_dir / CONFIG_FILE) if (run_dir / CONFIG_FILE).is_file() else {}
    rows: list[Row] = []
    notes: list[str] = []
    if (run_dir / ZERO_SHOT / METRICS_FILE).is_file():
        rows.append(Row(ZERO_SHOT, "zero-shot (public encoder)", "zero-shot", None,
                        _metrics(run_dir / ZERO_SHOT / METRICS_FILE)))
    if (run_dir / ORIGINAL / METRICS_FILE).is_file():
        ledger, source = _ledger(run_dir / ORIGINAL / RETRIEVER, run_dir / ORIGINAL)
        rows.append(Row(ORIGINAL, "original pairs (non-private)", "original", math.inf,
                        _metrics(run_dir / ORIGINAL / METRICS_FILE), ledger, source, read_timing(run_dir / ORIGINAL)))
    for key, label in PUBLIC_ROWS.items():
        if (run_dir / key / METRICS_FILE).is_file():
            ledger, source = _ledger(run_dir / key / GENERATOR, run_dir / key / SYNTHETIC, run_dir / key / RETRIEVER)
            rows.append(Row(key, label, key, 0.0, _metrics(run_dir / key / METRICS_FILE), ledger, source,
                            read_timing(run_dir / key)))
    stages = []
    for child in sorted(run_dir.iterdir()):
        if not child.is_dir() or not (child / METRICS_FILE).is_file():
            continue
        if m := EPS_DIR.match(child.name):
            ledger, source = _ledger(child / GENERATOR, child / SYNTHETIC, child / RETRIEVER)
            eps = ledger["epsilon"] if ledger else parse_eps(m["eps"])
            method = f"dp-synthetic{m['suffix'] or ''}"
            stages.append(Row(child.name, f"{method_label(method)} (ε={format_epsilon(parse_eps(m['eps']))})",
                              method, eps, _metrics(child / METRICS_FILE), ledger, source, read_timing(child),
                              grid_epsilon=parse_eps(m["eps"])))
        elif m := _DIRECT_DIR.match(child.name):
            ledger, source = _ledger(child / RETRIEVER, child)
            eps = ledger["epsilon"] if ledger else parse_eps(m["eps"])
            chosen = ", chosen with DP on held-out units" if m["suffix"] else ""
            stages.append(Row(child.name, f"direct {m['method']}{chosen} (ε={format_epsilon(parse_eps(m['eps']))})",
                              f"direct-{m['method']}{m['suffix'] or ''}", eps, _metrics(child / METRICS_FILE), ledger,
                              source, read_timing(child), grid_epsilon=parse_eps(m["eps"])))
    stages.sort(key=lambda r: (not r.method.startswith("dp-synthetic"), r.method, -r.epsilon if r.epsilon is not None else 0))
    rows += stages
    for r in rows:
        r.per_query = _per_query(run_dir / r.key / PER_QUERY_FILE)
        if (run_dir / r.key / SYNTHETIC / "manifest.json").is_file():
            r.queryness = synthetic_queryness(run_dir / r.key / SYNTHETIC)
        if (run_dir / r.key / MAUVE_FILE).is_file():
            r.mauve = _mauve(run_dir / r.key / MAUVE_FILE)
        if r.method not in ("zero-shot",) and r.ledger is None:
            notes.append(f"{r.key}: no privacy ledger found")
    if not rows:
        raise InputError("no results (no */metrics.json): is this a privret run directory?", path=run_dir)
    scores = {r.key: (r.metrics["ndcg@10"], r.per_query) for r in rows}
    bar, against_bar = versus_bar(scores, [r.key for r in rows if r.epsilon == 0])
    return RunData(run_dir=run_dir, name=str(config.get("name") or run_dir.name), config=config, rows=rows,
                   similarity=_similarity(run_dir), canaries=_canaries(run_dir),
                   zero_shot_datasets=_zero_shot_datasets(run_dir),
                   examples=_examples(run_dir, config, stages, show_private_queries, examples), notes=notes,
                   versus=versus_zero_shot(scores), bar=bar, versus_bar=against_bar,
                   private_timings_and_counts=show_private_timings_and_counts)


def _mauve(path: Path) -> float:
    """The score of a pipeline's ``<row>/mauve.json`` (:mod:`privret.pipeline.similarity`)."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("mauve"), (int, float)):
        raise InputError("expected an object with a numeric 'mauve'", path=path, field="mauve")
    return float(data["mauve"])


def _per_query(path: Path) -> dict[str, float] | None:
    """NDCG@10 per query id from a ``per_query.json``; None when the file is absent (an older run)."""
    if not path.is_file():
        return None
    data = read_json(path)
    try:
        return {str(qid): float(m["ndcg@10"]) for qid, m in data.items()}
    except (AttributeError, KeyError, TypeError, ValueError):
        raise InputError("expected {query id: {'ndcg@10': number, ...}}", path=path, field="ndcg@10") from None


def read_timing(stage: Path) -> dict:
    """A row directory's ``timing.json`` ({stage_seconds: seconds}); {} when it has none yet."""
    path = stage / TIMING_FILE
    if not path.is_file():
        return {}
    data = read_json(path)
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise InputError("expected {stage: seconds}", path=path)
    return data


def _similarity(run_dir: Path) -> list[dict]:
    """``similarity.json`` at the run's root (one result of
    :func:`privret.evaluate.similarity.evaluate_similarity`, a list of them, or an object holding them
    under ``results`` or keyed by label) and ``<stage>/similarity.json`` (one result per stage)."""
    out = _similarity_file(run_dir / "similarity.json") if (run_dir / "similarity.json").is_file() else []
    for path in sorted(run_dir.glob("*/similarity.json")):
        out += _similarity_file(path, label=path.parent.name)
    out.sort(key=lambda r: -(r["epsilon"] if r["epsilon"] is not None else -1))
    return out


def _similarity_file(path: Path, label: str | None = None) -> list[dict]:
    data = read_json(path)
    if isinstance(data, dict) and "results" in data:
        data = data["results"]
    if isinstance(data, dict) and "bleu" in data:
        data = [data]
    elif isinstance(data, dict):
        data = [{**v, "label": k} for k, v in data.items() if isinstance(v, dict)]
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise InputError("expected similarity results (an object or a list of objects)", path=path)
    out = []
    for i, item in enumerate(data):
        if "bleu" not in item and "mauve" not in item:
            raise InputError(f"result {i + 1} has neither 'bleu' nor 'mauve'", path=path, field="bleu")
        synthetic = item.get("synthetic") or {}
        eps = _float(synthetic.get("epsilon")) if isinstance(synthetic, dict) else None
        if eps is None and "epsilon" in item:
            eps = _float(item["epsilon"])
        details = item.get("mauve_details") or {}
        name = item.get("label") or label or (f"ε={format_epsilon(eps)}" if eps is not None else f"#{i + 1}")
        out.append({"label": name,
                     "epsilon": eps, "bleu": _float(item.get("bleu")), "mauve": _float(item.get("mauve")),
                     "pairs": item.get("pairs"), "featurizer": details.get("featurizer") or item.get("featurizer")})
    return out


def _canaries(run_dir: Path) -> dict | None:
    for path in (run_dir / "canaries.json", run_dir / "canaries" / "canaries.json"):
        if path.is_file():
            data = read_json(path)
            if not isinstance(data, dict) or not isinstance(data.get("results"), list):
                raise InputError("expected a canary audit ('results' list)", path=path, field="results")
            return data
    return None


def _zero_shot_datasets(run_dir: Path) -> list[dict]:
    """Top-level JSON files in the ``privret evaluate retrieval --datasets`` shape: {split, datasets, rows}."""
    found = []
    for path in sorted(run_dir.glob("*.json")):
        if path.name in (CONFIG_FILE, SUMMARY_FILE, "similarity.json", "canaries.json"):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if (isinstance(data, dict) and isinstance(data.get("datasets"), dict) and isinstance(data.get("rows"), list)
                and all(isinstance(r, dict) and isinstance(r.get("metrics"), dict) for r in data["rows"])):
            found.append({**data, "file": path.name})
    return found


def _read_synthetic(stage: Path) -> tuple[dict[str, list[str]], dict[str, dict]]:
    """doc id -> synthetic queries, and doc id -> document, from ``stage/synthetic``."""
    from privret.data.beir import load_beir

    dataset = load_beir(stage / SYNTHETIC, splits=["train"])
    by_doc: dict[str, list[str]] = {}
    for qid, docs in dataset.split("train").items():
        for doc_id in docs:
            by_doc.setdefault(doc_id, []).append(dataset.queries[qid])
    docs = {d.id: {"id": d.id, "title": d.title, "text": d.text} for d in dataset.corpus.values()}
    return by_doc, docs


def _examples(run_dir: Path, config: dict, stages: list[Row], show_private: bool, count: int) -> Examples | None:
    synthetic_stages = [r for r in stages if r.method == "dp-synthetic" and (run_dir / r.key / SYNTHETIC).is_dir()]
    if not synthetic_stages or count <= 0:
        return None
    per_label: dict[str, dict[str, list[str]]] = {}
    documents: dict[str, dict] = {}
    hidden = []
    for r in synthetic_stages:
        label = r.key.removeprefix("eps-")
        if not show_private and (r.epsilon is None or not math.isfinite(r.epsilon)):
            hidden.append(label)  # a non-private generator may reproduce private text
            continue
        by_doc, docs = _read_synthetic(run_dir / r.key)
        per_label[label] = by_doc
        documents.update(docs)
    if not per_label:
        return Examples([], {}, None, hidden)
    common = set.intersection(*(set(v) for v in per_label.values()))
    chosen = sorted(common)[:count]
    originals = None
    if show_private:
        originals = _original_queries(config, chosen)
    synthetic = {k: {d: v.get(d, []) for d in chosen} for k, v in per_label.items()}
    return Examples([documents[d] for d in chosen], synthetic, originals, hidden)


def _original_queries(config: dict, doc_ids: list[str]) -> dict[str, list[str]] | None:
    dataset = config.get("dataset")
    split = config.get("train_split", "train")
    if not dataset or not Path(dataset).is_dir():
        return None
    from privret.data.beir import load_beir

    data = load_beir(dataset, splits=[split])
    wanted = set(doc_ids)
    out: dict[str, list[str]] = {d: [] for d in doc_ids}
    for qid, docs in data.split(split).items():
        for doc_id, score in docs.items():
            if doc_id in wanted and score > 0:
                out[doc_id].append(data.queries[qid])
    return out
