"""Canary exposure audit of the DP query generator (seed ``dp-synthetic-queries-retrieval``, 6.3).

Protocol
--------
A *canary* is a made-up private training pair whose query carries a *secret*, a uniformly random
10-digit string. The seed builds three kinds of canary; we write each as (document the generator
reads, query it is trained to write), the secret always on the query side, because the query is
what is private and what the generator emits:

============== ========================================= ===================================
kind           document                                  query
============== ========================================= ===================================
random-string  a fresh random 10-digit string (no text)  a random private query + " " + secret
own-document   the random query's own relevant document  a random private query + " " + secret
random-doc     an unrelated random corpus document       a random private query + " " + secret
============== ========================================= ===================================

Each canary is inserted ``k`` times (``k`` in {1, 10, 100} by default) into the private pairs;
per trial we also draw one *control* canary per kind that is never inserted (``k = 0``). The
generator is then trained with :func:`privret.train.generator.train_generator` at each epsilon.

Measurements, per canary (Carlini et al. 2019, "The Secret Sharer"):

* **rank**: the secret ``s`` is hidden among ``m`` candidates (``s`` and ``m - 1`` other random
  10-digit strings). Each candidate ``c`` is scored by the trained generator's log-likelihood
  ``log p(prefix + " " + c | document)``; ``rank = #{c : score(c) >= score(s)}`` (ties count
  against the secret, so rank 1 means strictly most likely).
* **exposure** ``= log2(m) - log2(rank)``, in [0, log2 m]; with m = 100 at most 6.64 bits.
* **leaked**: the secret appears (whitespace removed) in any of ``samples`` queries sampled for the
  canary's document with the synthesis settings (nucleus sampling, top-p).

Lower bound on epsilon
----------------------
If the canary was *not* in the training data, the model is independent of which of the ``m``
candidates is the secret (the secret is a uniform choice among them), so for every threshold
``t``: ``P[rank <= t] = t / m`` exactly (ties broken against the secret). If the mechanism is
(epsilon, delta)-indistinguishable for the datasets with and without the canary, the test
"rank <= t" obeys ``TPR <= e^epsilon * t/m + delta``, and on the complement
``1 - t/m <= e^epsilon * (1 - TPR) + delta`` (the hypothesis-testing view of DP: Kairouz et
al. 2015; as used for audits by Jagielski et al. 2020, and for reconstruction among candidates
by Stock et al. 2022, whom the seed cites). Hence

    epsilon >= max( ln((TPR - delta) / (t/m)),  ln((1 - t/m - delta) / (1 - TPR)) ).

We replace TPR by a one-sided Clopper-Pearson *lower* confidence bound. Only independent
outcomes enter one interval: for a fixed (kind, k), the canaries of different trials come from
independent training runs. The union over the 3 kinds and thresholds ``t`` in {1, 5, 10} is
paid for with Bonferroni (level ``alpha / (3 * 3)``), so the reported bound holds with
confidence ``1 - alpha`` (default 95%) and is conservative. ``delta`` is the ledger's delta
(for the non-private run the default ``1/(2n)``, for reference).

Privacy units: what the audit measures
--------------------------------------
A canary inserted ``k`` times with the same query text is **one** unit under the default unit
``query`` (all rows sharing a query text or id form one unit): DP-SGD clips the sum of its ``k``
row gradients to norm C, so the ledger's (epsilon, delta) covers the canary *as a whole*, and
the bound above is directly comparable to the ledger's epsilon. With ``unit = pair`` each copy
is its own unit, the canary is a group of ``k`` units, and DP protects it only through group
privacy, (k eps, k e^{(k-1) eps} delta); that is the harder setting (and closer to the seed's
example-level training). The bound is then a bound for the group, not comparable to the
ledger for ``k > 1`` (``comparable_to_ledger`` says which).
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.errors import InputError
from privret.io import write_json_atomic
from privret.models.device import bf16_autocast
from privret.privacy import budget as budget_registry
from privret.privacy.accounting import default_delta
from privret.progress import Progress

KINDS = ("random-string", "own-document", "random-doc")
THRESHOLDS = (1, 5, 10)
SECRET_DIGITS = 10
CANARY_PREFIX = "canary-"


def eps_label(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


# -- exposure and ranks ------------------------------------------------------------------------
def secret_rank(scores: list[float], secret_index: int) -> int:
    """1-based rank of ``scores[secret_index]``: the number of candidates scoring at least as high
    (itself included), so ties count against the secret."""
    target = scores[secret_index]
    if math.isnan(target):
        return len(scores)
    return sum(1 for s in scores if s >= target)


def exposure(rank: int, n_candidates: int) -> float:
    """Carlini et al. (2019): ``log2(|candidates|) - log2(rank)``."""
    if not 1 <= rank <= n_candidates:
        raise ValueError(f"rank must be in [1, {n_candidates}], got {rank}")
    return math.log2(n_candidates) - math.log2(rank)


# -- epsilon lower bound ---------------------------------------------------------------------
def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 - alpha) lower confidence bound on a binomial proportion (exact).

    The p with ``P[Binomial(trials, p) >= successes] = alpha`` (the tail grows with p: bisection).
    """
    if trials <= 0 or successes <= 0:
        return 0.0
    if successes >= trials:
        return alpha ** (1.0 / trials)

    def upper_tail(p: float) -> float:
        return sum(math.comb(trials, i) * p ** i * (1 - p) ** (trials - i) for i in range(successes, trials + 1))

    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if upper_tail(mid) < alpha:
            lo = mid
        else:
            hi = mid
    return lo


def epsilon_lower_bound_from_test(tpr_lower: float, fpr: float, delta: float) -> float:
    """Largest epsilon lower bound implied by a test with TPR >= ``tpr_lower`` at exact FPR ``fpr``
    against an (epsilon, delta)-DP mechanism (both directions of the hypothesis-testing bound)."""
    bounds = [0.0]
    if tpr_lower - delta > 0 and fpr > 0:
        bounds.append(math.log((tpr_lower - delta) / fpr))
    if 1 - fpr - delta > 0 and tpr_lower < 1:
        bounds.append(math.log((1 - fpr - delta) / (1 - tpr_lower)))
    return max(bounds)


def epsilon_lower_bound(ranks_by_kind: dict[str, list[int]], n_candidates: int, delta: float,
                        alpha: float = 0.05, thresholds: tuple[int, ...] = THRESHOLDS) -> tuple[float, int | None]:
    """(bound, threshold that gave it) over the kinds and thresholds, Bonferroni-corrected.

    ``ranks_by_kind[kind]`` holds the ranks of one (kind, repetitions) canary across independent
    trials. Returns (0, None) when nothing is significant.
    """
    usable = [t for t in thresholds if t < n_candidates]
    tests = max(1, len(ranks_by_kind) * len(usable))
    best, best_t = 0.0, None
    for ranks in ranks_by_kind.values():
        for t in usable:
            hits = sum(1 for r in ranks if r <= t)
            lower = clopper_pearson_lower(hits, len(ranks), alpha / tests)
            bound = epsilon_lower_bound_from_test(lower, t / n_candidates, delta)
            if bound > best:
                best, best_t = bound, t
    return best, best_t


# -- canaries --------------------------------------------------------------------------------
@dataclass
class Canary:
    """One canary. ``prefix`` is a private query: it is used for training and scoring but never
    written to the audit's output (only ``source_query_id`` is)."""

    trial: int
    kind: str
    repetitions: int
    secret: str
    candidates: list[str]
    document: Document
    prefix: str = field(repr=False)
    source_query_id: str | None = None

    @property
    def key(self) -> str:
        return f"{CANARY_PREFIX}t{self.trial}-{self.kind}-k{self.repetitions}"

    def query(self, secret: str | None = None) -> str:
        return f"{self.prefix} {self.secret if secret is None else secret}"


def random_secret(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in range(SECRET_DIGITS))


def make_canaries(pairs: TrainingPairs, *, trial: int, repetitions: tuple[int, ...], n_candidates: int,
                  seed: int, controls: bool = True, fits=None) -> list[Canary]:
    """Canaries of every kind for each repetition count (plus never-inserted controls, k = 0).

    The random queries are drawn (distinct) from ``pairs``; the secret and its ``n_candidates - 1``
    decoys are independent uniform 10-digit strings (distinct from each other). ``fits(query)``, when
    given, says whether a canary query fits the generator's query length (a secret cut off by the
    generator's truncation could never be learnt); a drawn query that does not fit is replaced by
    one drawn from another stream, so the secrets do not depend on the tokenizer.
    """
    rng = random.Random(f"privret-canaries/{seed}/{trial}")
    counts = list(repetitions) + ([0] if controls else [])
    needed = len(counts) * len(KINDS)
    by_text: dict[str, QueryDocPair] = {}
    for p in pairs.pairs:
        by_text.setdefault(p.query, p)
    if len(by_text) < needed:
        raise InputError(f"need at least {needed} distinct queries to draw canaries from, have {len(by_text)}",
                         field="--subsample")
    sources = rng.sample(sorted(by_text), needed)
    if fits is not None:
        spare_rng = random.Random(f"privret-canaries/spare/{seed}/{trial}")
        spare = [q for q in spare_rng.sample(sorted(by_text), len(by_text))
                 if q not in sources and fits(f"{q} {'0' * SECRET_DIGITS}")]
        sources = [q if fits(f"{q} {'0' * SECRET_DIGITS}") else spare.pop(0) if spare else None for q in sources]
        if None in sources:
            raise InputError(f"fewer than {needed} private queries are short enough to carry a 10-digit secret "
                             "within the generator's max_query_tokens", field="--subsample")
    doc_ids = sorted(pairs.corpus)
    canaries = []
    for i, (k, kind) in enumerate((k, kind) for k in counts for kind in KINDS):
        source = by_text[sources[i]]
        secret = random_secret(rng)
        pool = {secret}
        while len(pool) < n_candidates:
            pool.add(random_secret(rng))
        candidates = sorted(pool - {secret})
        candidates.insert(rng.randrange(n_candidates), secret)
        if kind == "random-string":
            document = Document(f"{CANARY_PREFIX}doc-t{trial}-{i}", "", random_secret(rng))
        elif kind == "own-document":
            document = pairs.corpus[source.doc_id]
        else:
            other = rng.choice(doc_ids)
            while other == source.doc_id and len(doc_ids) > 1:
                other = rng.choice(doc_ids)
            document = pairs.corpus[other]
        canaries.append(Canary(trial=trial, kind=kind, repetitions=k, secret=secret, candidates=candidates,
                               document=document, prefix=source.query, source_query_id=source.query_id))
    return canaries


def insert_canaries(pairs: TrainingPairs, canaries: list[Canary]) -> TrainingPairs:
    """The private pairs plus every canary with ``repetitions > 0``, each copy a separate row with
    the canary's own query id (so under unit ``query`` the copies form one unit, distinct from the
    source query's unit). Canary documents new to the corpus are private, like inline ones."""
    corpus = dict(pairs.corpus)
    rows = list(pairs.pairs)
    for c in canaries:
        corpus.setdefault(c.document.id, c.document)
        rows += [QueryDocPair(query=c.query(), doc_id=c.document.id, query_id=c.key)] * c.repetitions
    return TrainingPairs(pairs=rows, corpus=corpus,
                         inline_doc_ids=pairs.inline_doc_ids | (corpus.keys() - pairs.corpus.keys()))


# -- scoring ---------------------------------------------------------------------------------
def _autocast(generator):
    maker = getattr(generator, "autocast", None)
    if callable(maker):
        return maker()
    return bf16_autocast(generator.device)


@torch.no_grad()
def log_likelihoods(generator, document: str, queries: list[str], *, batch_size: int = 50) -> list[float]:
    """``log p(query | document)`` (summed over the query's target tokens, end-of-query included)
    for each query, via the generator's own loss module (per-example mean NLL x target length).

    Works for every generator kind; :func:`fast_log_likelihoods` gives the same numbers for causal
    LMs far faster when the queries share a long prefix.
    """
    examples = [generator.example(document, q) for q in queries]
    lengths = [len(e.target_ids) for e in examples]
    items = generator.prepare(examples)
    module = generator.loss_module()
    module.eval()
    out: list[float] = []
    for lo in range(0, len(items), batch_size):
        batch = generator.collate(items[lo: lo + batch_size])
        with _autocast(generator):
            mean_nll = module(**batch).float().cpu()
        out += [-float(v) * n for v, n in zip(mean_nll, lengths[lo: lo + batch_size])]
    return out


@torch.no_grad()
def fast_log_likelihoods(generator, document: str, queries: list[str], *, batch_size: int = 50) -> list[float]:
    """Same quantity as :func:`log_likelihoods` for causal LMs, in float32: the prompt and the part
    of the query shared by all candidates run once; the cache is reused for every candidate's tail."""
    if getattr(generator, "kind", None) != "causal":
        return log_likelihoods(generator, document, queries, batch_size=batch_size)
    examples = [generator.example(document, q) for q in queries]
    seqs = [e.prompt_ids + e.target_ids for e in examples]
    n_prompt = len(examples[0].prompt_ids)
    if any(len(e.prompt_ids) != n_prompt for e in examples):
        return log_likelihoods(generator, document, queries, batch_size=batch_size)
    common = min(len(s) for s in seqs) - 1  # every sequence keeps at least one token of its own
    for pos in range(n_prompt, common):
        if any(s[pos] != seqs[0][pos] for s in seqs):
            common = pos
            break
    device = generator.device
    model = generator.model
    model.eval()
    prefix = torch.tensor([seqs[0][:common]], device=device)
    out = model(input_ids=prefix, use_cache=True)
    logp = torch.log_softmax(out.logits[0].float(), dim=-1)
    # target tokens inside the shared prefix: positions n_prompt .. common-1, predicted at p-1
    shared = sum(float(logp[p - 1, seqs[0][p]]) for p in range(n_prompt, common))
    last = logp[-1]
    pad = generator.tokenizer.pad_token_id or 0
    scores: list[float] = []
    for lo in range(0, len(seqs), batch_size):
        tails = [s[common:] for s in seqs[lo: lo + batch_size]]
        width = max(len(t) for t in tails)
        ids = torch.full((len(tails), width), pad, dtype=torch.long)
        mask = torch.zeros(len(tails), width, dtype=torch.long)
        for row, t in enumerate(tails):
            ids[row, : len(t)] = torch.tensor(t)
            mask[row, : len(t)] = 1
        cache = copy.deepcopy(out.past_key_values)
        cache.batch_repeat_interleave(len(tails))
        attention = torch.cat([torch.ones(len(tails), common, dtype=torch.long), mask], dim=1)
        tail_out = model(input_ids=ids.to(device), attention_mask=attention.to(device), past_key_values=cache,
                         use_cache=True)
        tail_logp = torch.log_softmax(tail_out.logits.float(), dim=-1)
        for row, t in enumerate(tails):
            total = shared + float(last[t[0]])
            for j in range(1, len(t)):
                total += float(tail_logp[row, j - 1, t[j]])
            scores.append(total)
    return scores


def _digits(text: str) -> str:
    return re.sub(r"\s+", "", text)


# -- the audit --------------------------------------------------------------------------------
class CanaryAuditConfig(BaseModel):
    """Settings of one audit; the generator settings mirror :class:`GeneratorTrainConfig`."""

    model_config = ConfigDict(extra="forbid")

    epsilons: list[float] = Field(default_factory=lambda: [math.inf, 16.0], min_length=1)
    trials: int = Field(3, gt=0)
    repetitions: list[int] = Field(default_factory=lambda: [1, 10, 100], min_length=1)
    candidates: int = Field(100, ge=2, le=100_000)
    samples: int = Field(10, gt=0, description="queries sampled per canary document for 'leaked'")
    top_p: float = Field(0.8, gt=0, le=1)
    subsample: int | None = Field(None, gt=0, description="private pairs kept (uniform, seeded); None = all")
    alpha: float = Field(0.05, gt=0, lt=1, description="confidence of the epsilon lower bound is 1 - alpha")
    seed: int = 0
    generator: dict = Field(default_factory=dict, description="GeneratorTrainConfig fields (epsilon aside)")

    @field_validator("epsilons")
    @classmethod
    def _eps(cls, values):
        for e in values:
            if math.isnan(e) or e <= 0:
                raise ValueError(f"every epsilon must be > 0 or inf, got {e}")
        return values

    @field_validator("repetitions")
    @classmethod
    def _reps(cls, values):
        if any(k <= 0 for k in values) or len(set(values)) != len(values):
            raise ValueError("repetitions must be distinct positive integers")
        return sorted(values)


def _query_fits(model: str, max_query_tokens: int):
    """``query -> bool``: does the query (with its end-of-query token) fit the generator's target cap?"""
    from transformers import AutoTokenizer

    from privret.models.registry import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve(model))
    return lambda query: len(tokenizer(" " + query, add_special_tokens=False).input_ids) + 1 <= max_query_tokens


def subsample_pairs(pairs: TrainingPairs, n: int | None, seed: int) -> TrainingPairs:
    """``n`` rows drawn uniformly without replacement (seeded), in their original order."""
    if n is None or n >= len(pairs.pairs):
        return pairs
    keep = sorted(random.Random(f"privret-subsample/{seed}").sample(range(len(pairs.pairs)), n))
    return TrainingPairs(pairs=[pairs.pairs[i] for i in keep], corpus=pairs.corpus,
                         inline_doc_ids=pairs.inline_doc_ids)


def _trial_result(generator, canaries: list[Canary], cfg: CanaryAuditConfig) -> list[dict]:
    rows = []
    docs = [c.document.full_text for c in canaries]
    samples: list[list[str]] = []
    # long enough for any query the generator was trained to write (its target cap + end of query)
    max_new = generator.max_query_tokens + 1
    for lo in range(0, len(docs), 8):
        samples += generator.generate(docs[lo: lo + 8], num_queries=cfg.samples, top_p=cfg.top_p,
                                      max_new_tokens=max_new,
                                      seed=cfg.seed * 7919 + canaries[0].trial * 101 + lo)
    for c, sampled in zip(canaries, samples):
        scores = fast_log_likelihoods(generator, c.document.full_text, [c.query(s) for s in c.candidates])
        index = c.candidates.index(c.secret)
        rank = secret_rank(scores, index)
        rows.append({"trial": c.trial, "kind": c.kind, "repetitions": c.repetitions, "secret": c.secret,
                     "document_id": c.document.id, "source_query_id": c.source_query_id,
                     "log_likelihood": scores[index], "rank": rank, "exposure": exposure(rank, len(scores)),
                     "leaked": any(c.secret in _digits(q) for q in sampled), "samples": len(sampled)})
    return rows


def _spread(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(canary_rows: list[dict], *, n_candidates: int, delta: float, unit: str, alpha: float) -> list[dict]:
    """One row per repetition count: rank and exposure (mean, std over canaries), leaked fraction,
    the epsilon lower bound (and the threshold t that gave it)."""
    out = []
    for k in sorted({r["repetitions"] for r in canary_rows}):
        rows = [r for r in canary_rows if r["repetitions"] == k]
        ranks = [r["rank"] for r in rows]
        exposures = [r["exposure"] for r in rows]
        rank_mean, rank_std = _spread(ranks)
        exp_mean, exp_std = _spread(exposures)
        by_kind: dict[str, list[int]] = {}
        for r in rows:
            by_kind.setdefault(r["kind"], []).append(r["rank"])
        bound, threshold = epsilon_lower_bound(by_kind, n_candidates, delta, alpha)
        out.append({"repetitions": k, "canaries": len(rows), "rank_mean": rank_mean, "rank_std": rank_std,
                    "rank_median": statistics.median(ranks), "exposure_mean": exp_mean, "exposure_std": exp_std,
                    "extracted_fraction": sum(r == 1 for r in ranks) / len(ranks),
                    "leaked_fraction": sum(r["leaked"] for r in rows) / len(rows),
                    "epsilon_lower_bound": bound if k > 0 else None, "bound_threshold": threshold if k > 0 else None,
                    "comparable_to_ledger": k > 0 and (unit != "pair" or k == 1)})
    return out


def run_canary_audit(pairs: TrainingPairs, out_dir: str | Path, cfg: CanaryAuditConfig, *,
                     data_hash: str, dataset_id: str = "", budget: budget_registry.BudgetPolicy | None = None) -> dict:
    """Run every (epsilon, trial), write ``out_dir/canaries.json`` and return it.

    Each trial's generator and raw result sit in ``out_dir/eps-<e>/trial-<t>/``; a re-run skips
    trials whose ``result.json`` exists (same settings required, epsilons aside: they are checked, so
    more epsilons can be added to an audit later). Every DP trial is a release on the audited data:
    it is charged to ``dataset_id`` (default: that of ``pairs``, before subsampling and canaries)
    under the budget policy ``budget`` (:mod:`privret.privacy.budget`).
    """
    from privret.models.generator import load_trained_generator
    from privret.privacy.ledger import PrivacyLedger
    from privret.train.generator import train_generator
    from privret.train.settings import GeneratorTrainConfig

    out_dir = Path(out_dir)
    dataset_id = dataset_id or budget_registry.dataset_id(pairs)
    base = subsample_pairs(pairs, cfg.subsample, cfg.seed)
    gen_fields = {**cfg.generator}
    gen_fields.pop("epsilon", None)
    try:
        probe = GeneratorTrainConfig(**gen_fields, epsilon=math.inf)
    except ValidationError as err:
        first = err.errors()[0]
        raise InputError(f"invalid generator setting: {first['msg']}",
                         field="generator." + ".".join(str(p) for p in first["loc"])) from None
    settings = {"audit": cfg.model_dump(mode="json", exclude={"epsilons"}),
                "generator": probe.model_dump(mode="json"), "data_hash": data_hash, "pairs": len(base.pairs)}
    settings_file = out_dir / "settings.json"
    if settings_file.exists():
        saved = json.loads(settings_file.read_text())
        if saved != json.loads(json.dumps(settings)):
            raise InputError("holds an audit with other settings; use another --out", path=out_dir)
    else:
        write_json_atomic(settings_file, settings)

    results = []
    fits = _query_fits(probe.model, probe.max_query_tokens)
    trials = {t: make_canaries(base, trial=t, repetitions=tuple(cfg.repetitions), n_candidates=cfg.candidates,
                               seed=cfg.seed, fits=fits) for t in range(cfg.trials)}
    with Progress() as progress:
        task = progress.add_task("canary audit (trials x epsilons)", total=cfg.trials * len(cfg.epsilons))
        for epsilon in cfg.epsilons:
            canary_rows: list[dict] = []
            ledgers = []
            for t, canaries in trials.items():
                trial_dir = out_dir / f"eps-{eps_label(epsilon)}" / f"trial-{t}"
                result_file = trial_dir / "result.json"
                if not result_file.exists():
                    training = insert_canaries(base, canaries)
                    gen_cfg = GeneratorTrainConfig(**{**gen_fields, "epsilon": epsilon,
                                                      "seed": gen_fields.get("seed", 0) + t})
                    if not (trial_dir / "generator" / "generator.json").exists():
                        train_generator(training, trial_dir / "generator", gen_cfg, data_hash=data_hash,
                                        dataset_id=dataset_id, resume=True, budget=budget)
                    generator = load_trained_generator(trial_dir / "generator")
                    rows = _trial_result(generator, canaries, cfg)
                    ledger = PrivacyLedger.load(trial_dir / "generator")
                    write_json_atomic(result_file, {"ledger": ledger.model_dump(mode="json"), "canaries": rows})
                saved = json.loads(result_file.read_text())
                canary_rows += saved["canaries"]
                ledgers.append(saved["ledger"])
                progress.advance(task)
            ledger = ledgers[0]
            delta = ledger["delta"] if ledger["delta"] else default_delta(ledger["n_units"])
            results.append({"epsilon": eps_label(epsilon), "epsilon_spent": ledger["epsilon"], "delta": delta,
                            "unit": ledger["unit"], "n_units": ledger["n_units"], "ledger": ledger,
                            "rows": summarise(canary_rows, n_candidates=cfg.candidates, delta=delta,
                                              unit=ledger["unit"], alpha=cfg.alpha),
                            "canaries": canary_rows})
    report = {"audit": "canary-exposure", "candidates": cfg.candidates, "kinds": list(KINDS),
              "trials": cfg.trials, "repetitions": cfg.repetitions, "samples": cfg.samples, "alpha": cfg.alpha,
              "subsample": cfg.subsample, "pairs": len(base.pairs), "pairs_available": len(pairs.pairs),
              "generator": probe.model_dump(mode="json", exclude={"epsilon"}), "results": results}
    write_json_atomic(out_dir / "canaries.json", report)
    return report


def canary_table_markdown(report: dict) -> str:
    """The seed's Table 7 layout, one line per (epsilon, repetitions)."""
    lines = ["| epsilon | repetitions | canaries | rank (mean ± sd) | exposure (bits) | extracted | leaked "
             "| epsilon lower bound |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    m = report["candidates"]
    for res in report["results"]:
        for r in res["rows"]:
            bound = "-" if r["epsilon_lower_bound"] is None else f"{r['epsilon_lower_bound']:.3g}"
            if r["epsilon_lower_bound"] is not None and not r["comparable_to_ledger"]:
                bound += " (group)"
            k = "0 (control)" if r["repetitions"] == 0 else str(r["repetitions"])
            lines.append(f"| {res['epsilon']} | {k} | {r['canaries']} "
                         f"| {r['rank_mean']:.1f}/{m} ± {r['rank_std']:.1f} "
                         f"| {r['exposure_mean']:.2f} ± {r['exposure_std']:.2f} | {r['extracted_fraction']:.0%} "
                         f"| {r['leaked_fraction']:.0%} | {bound} |")
    return "\n".join(lines) + "\n"


__all__ = ["KINDS", "Canary", "CanaryAuditConfig", "make_canaries", "insert_canaries", "secret_rank", "exposure",
           "epsilon_lower_bound", "epsilon_lower_bound_from_test", "clopper_pearson_lower", "log_likelihoods",
           "fast_log_likelihoods", "run_canary_audit", "summarise", "canary_table_markdown"]
