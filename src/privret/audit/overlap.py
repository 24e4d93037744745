"""Was the public model trained on the private data? Two checks (Carranza et al., section 5.2.3). A public generator
that saw the private queries in pretraining could reproduce them whatever epsilon fine-tuning spent.

1. **Verbatim overlap** (:func:`corpus_overlap`): the fraction of the private queries, and of their documents,
   found in a corpus standing for the pretraining data, streamed once. Texts are normalised (NFKC, case-folded,
   non-alphanumeric runs to one space) into tokens; *found* means a contiguous run of whole tokens inside one
   record. Queries under ``min_tokens`` tokens are counted apart. Texts are indexed by their first two tokens,
   so the cost is linear in the corpus.
2. **Likelihood gap** (:func:`likelihood_test`): the public LM's mean per-token NLL on the private queries (M)
   against held-out queries of the same distribution (H); Mann-Whitney AUC ``A = P(L(m) < L(h)) + P(=) / 2``,
   z-score ``(A - 1/2) / sqrt((|M| + |H| + 1) / (12 |M| |H|))``; flagged when ``z > z_threshold`` and
   ``A >= auc_threshold``. A distribution shift between M and H also moves A: a flag is a reason to look.

Privacy: both reports read the private queries without DP, and the JSON is marked private (docs/audits.md,
section "Pretraining overlap audit").
"""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from privret.errors import InputError

_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalise(text: str) -> str:
    """NFKC, casefold, non-alphanumeric runs -> one space, trimmed (see module doc)."""
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def tokens(text: str) -> tuple[str, ...]:
    return tuple(normalise(text).split())


# ---------------------------------------------------------------------------------------------
class ExactMatcher:
    """Finds which of many token sequences occur, as whole-token runs, in a stream of records.

    Texts are indexed by their first ``min(3, len)`` tokens; a candidate found at a record position
    is confirmed by comparing its last token, then the whole run.
    """

    def __init__(self, texts: dict[str, str]):
        self.index: dict[int, dict[tuple[str, ...], list[tuple[str, list[str]]]]] = {1: {}, 2: {}, 3: {}}
        for key, text in texts.items():
            toks = list(tokens(text))
            if toks:
                head = tuple(toks[:3])
                self.index[len(head)].setdefault(head, []).append((key, toks))
        self.unigrams = {head[0] for head in self.index[1]}
        self.size = sum(len(c) for table in self.index.values() for c in table.values())
        self.found: dict[str, str] = {}  # key -> "file:line" of the first record that contains it

    @property
    def done(self) -> bool:
        return len(self.found) >= self.size

    def scan(self, record: str, where: str) -> None:
        toks = normalise(record).split()
        n = len(toks)
        if not n:
            return
        unigram, bigram, trigram = self.index[1], self.index[2], self.index[3]
        if unigram:
            for tok in self.unigrams.intersection(toks):
                for key, _ in unigram[(tok,)]:
                    self.found.setdefault(key, where)
        if bigram:
            for pair in set(zip(toks, toks[1:])).intersection(bigram):
                for key, _ in bigram[pair]:
                    self.found.setdefault(key, where)
        if not trigram:
            return
        found = self.found
        for i, head in enumerate(zip(toks, toks[1:], toks[2:])):
            candidates = trigram.get(head)
            if candidates is None:
                continue
            for key, seq in candidates:
                end = i + len(seq)
                if key not in found and end <= n and toks[end - 1] == seq[-1] and toks[i:end] == seq:
                    found[key] = where


def _open_binary(path: Path):
    raw = open(path, "rb")
    if path.suffix == ".gz":
        return raw, gzip.GzipFile(fileobj=raw)
    return raw, raw


def iter_records(path: str | Path, *, field: str | None = None,
                 on_bytes: Callable[[int], None] | None = None) -> Iterator[tuple[int, str]]:
    """Stream (1-based line number, text) from a text or JSONL file (``field`` set = JSONL).

    Bytes that are not UTF-8 are replaced (a web crawl is not clean text); a JSONL line that is not
    a JSON object with a string ``field`` is an :class:`InputError` naming the line. Records without ``field``
    are skipped (heterogeneous dumps): :func:`corpus_overlap` refuses a corpus of which no record was read.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("corpus file not found", path=path)
    raw, stream = _open_binary(path)
    last = 0
    try:
        for number, line in enumerate(stream, start=1):
            text = line.decode("utf-8", errors="replace")
            if on_bytes is not None and number % 1024 == 0:
                pos = raw.tell()
                on_bytes(pos - last)
                last = pos
            if field is None:
                yield number, text
                continue
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as err:
                raise InputError(f"malformed JSON ({err.msg})", path=path, line=number) from None
            if not isinstance(obj, dict):
                raise InputError("expected a JSON object", path=path, line=number)
            value = obj.get(field)
            if value is None:
                continue  # records without the field are skipped, not errors (heterogeneous dumps)
            if not isinstance(value, str):
                raise InputError(f"expected a string, got {type(value).__name__}", path=path, line=number,
                                 field=field)
            yield number, value
        if on_bytes is not None:
            on_bytes(raw.tell() - last)
    except (OSError, EOFError) as err:
        raise InputError(f"cannot read ({err})", path=path) from None
    finally:
        stream.close()
        raw.close()


@dataclass
class OverlapResult:
    kind: str
    total: int
    eligible: int
    found: dict[str, str] = field(default_factory=dict)

    def summary(self, texts: dict[str, str], *, show_text: bool) -> dict:
        rows = [{"id": k, "where": self.found[k], **({"text": texts[k]} if show_text else {})}
                for k in sorted(self.found)]
        return {"total": self.total, "eligible": self.eligible, "found": len(self.found),
                "fraction": len(self.found) / self.eligible if self.eligible else None, "matches": rows}


def corpus_overlap(private_root: str | Path, split: str, corpus_files: list[str | Path], *,
                   field: str | None = None, min_tokens: int = 1, sample: int | None = None, seed: int = 0,
                   check_documents: bool = True) -> dict:
    """Fraction of the split's queries (and their documents) found verbatim in the corpus files.

    ``field``: read every file as JSONL and match against ``obj[field]``; ``None``: a ``.jsonl``
    file uses ``text``, any other file is plain text with one record per line.
    """
    from privret.data.beir import load_beir
    from privret.progress import Progress

    if min_tokens < 1:
        raise InputError("must be at least 1", field="min_tokens")
    dataset = load_beir(private_root, splits=[split])
    qrels = dataset.split(split)
    qids = sorted(qrels)
    if sample is not None:
        if sample < 1:
            raise InputError("must be at least 1", field="sample")
        qids = sorted(random.Random(seed).sample(qids, min(sample, len(qids))))
    queries = {q: dataset.queries[q] for q in qids}
    doc_ids = list(dict.fromkeys(d for q in qids for d, rel in qrels[q].items() if rel > 0))
    documents = {d: dataset.corpus[d].text for d in doc_ids} if check_documents else {}

    eligible_q = {k: v for k, v in queries.items() if len(tokens(v)) >= min_tokens}
    eligible_d = {k: v for k, v in documents.items() if len(tokens(v)) >= min_tokens}
    matchers = {"queries": ExactMatcher(eligible_q), "documents": ExactMatcher(eligible_d)}
    files = [Path(p) for p in corpus_files]
    for path in files:
        if not path.is_file():
            raise InputError("corpus file not found", path=path)
    total_bytes = sum(p.stat().st_size for p in files)
    records = 0
    with Progress() as progress:
        task = progress.add_task("scanning corpus (bytes)", total=total_bytes)
        for path in files:
            file_field = field if field is not None else ("text" if path.name.endswith((".jsonl", ".jsonl.gz"))
                                                           else None)
            for number, text in iter_records(path, field=file_field,
                                             on_bytes=lambda n: progress.advance(task, n)):
                records += 1
                for matcher in matchers.values():
                    if not matcher.done:
                        matcher.scan(text, f"{path}:{number}")
    if records == 0:  # a clean 0% would say nothing: no text was read (no record has the field, say)
        raise InputError(f"no record read from the corpus (JSONL records without the field '{field or 'text'}' are "
                         "skipped): nothing to audit", path=", ".join(str(p) for p in files))
    q_res = OverlapResult("queries", len(queries), len(eligible_q), matchers["queries"].found)
    d_res = OverlapResult("documents", len(documents), len(eligible_d), matchers["documents"].found)
    return {
        "private": {"root": str(Path(private_root)), "split": split, "sampled": sample, "seed": seed},
        "corpus": {"files": [str(p) for p in files], "bytes": total_bytes, "records": records,
                   "field": field},
        "normalisation": "NFKC, casefold, non-alphanumeric runs -> space; found = whole-token run inside "
                         "one record",
        "min_tokens": min_tokens,
        "queries": q_res.summary(queries, show_text=True),
        "documents": d_res.summary(documents, show_text=False) if check_documents else None,
    }


# ---------------------------------------------------------------------------------------------
def per_token_losses(model, tokenizer, texts: list[str], *, batch_size: int = 16,
                     progress: Callable[[int], None] | None = None) -> list[float]:
    """Mean per-token NLL (nats) of each text under a causal LM, the text prefixed by BOS (or EOS)."""
    import torch
    import torch.nn.functional as F

    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if start is None:
        raise InputError("the tokenizer has neither a BOS nor an EOS token", field="model")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else start
    device = next(model.parameters()).device
    encoded = [[start] + tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    out = [math.nan] * len(encoded)
    model.eval()
    with torch.no_grad():
        for lo in range(0, len(order), batch_size):
            idx = order[lo: lo + batch_size]
            length = max(len(encoded[i]) for i in idx)
            ids = torch.full((len(idx), length), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), length), dtype=torch.long)
            for row, i in enumerate(idx):
                ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
                mask[row, : len(encoded[i])] = 1
            ids, mask = ids.to(device), mask.to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            token_nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            target_mask = mask[:, 1:].float()
            per_text = (token_nll * target_mask).sum(1) / target_mask.sum(1).clamp(min=1)
            for row, i in enumerate(idx):
                out[i] = float(per_text[row])
            if progress is not None:
                progress(len(idx))
    return out


def mann_whitney_auc(members: list[float], heldout: list[float]) -> float:
    """A = P(m < h) + 1/2 P(m = h): the probability that a random private query has the lower loss."""
    pooled = sorted([(v, 0) for v in members] + [(v, 1) for v in heldout])
    ranks = [0.0] * len(pooled)
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1  # mid-rank, 1-based
        i = j + 1
    rank_sum_heldout = sum(r for r, (_, side) in zip(ranks, pooled) if side == 1)
    n_m, n_h = len(members), len(heldout)
    u_heldout = rank_sum_heldout - n_h * (n_h + 1) / 2  # pairs (m, h) with h > m, ties counted 1/2
    return u_heldout / (n_m * n_h)


@dataclass
class LikelihoodVerdict:
    auc: float
    z: float
    p_value: float
    flagged: bool


def likelihood_statistic(members: list[float], heldout: list[float], *, z_threshold: float = 3.09,
                         auc_threshold: float = 0.6) -> LikelihoodVerdict:
    """AUC, one-sided z and p-value of the loss gap, and the flag (see module doc)."""
    if len(members) < 2 or len(heldout) < 2:
        raise InputError("the likelihood test needs at least 2 private and 2 held-out queries")
    auc = mann_whitney_auc(members, heldout)
    n_m, n_h = len(members), len(heldout)
    sd = math.sqrt((n_m + n_h + 1) / (12 * n_m * n_h))
    z = (auc - 0.5) / sd
    p_value = 0.5 * math.erfc(z / math.sqrt(2))
    return LikelihoodVerdict(auc, z, p_value, bool(z > z_threshold and auc >= auc_threshold))


def _describe(values: list[float]) -> dict:
    ordered = sorted(values)
    n = len(ordered)
    mean = sum(ordered) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in ordered) / max(n - 1, 1))
    return {"n": n, "mean": mean, "sd": sd, "median": ordered[n // 2] if n % 2 else
            (ordered[n // 2 - 1] + ordered[n // 2]) / 2}


def likelihood_test(private_queries: list[str], heldout_queries: list[str], *, model: str = "smollm2-135m",
                    max_queries: int | None = 1000, seed: int = 0, batch_size: int = 16,
                    z_threshold: float = 3.09, auc_threshold: float = 0.6, loader=None) -> dict:
    """The public causal LM's loss on private vs held-out queries (see module doc).

    Held-out queries whose normalised text equals a private one are dropped (they would be members).
    ``max_queries`` caps each set (uniform subsample with ``seed``). ``loader(name)`` returns
    ``(model, tokenizer)``; by default :func:`privret.models.generator.load_generator`.
    """
    from privret.progress import Progress

    private_norm = {normalise(q) for q in private_queries}
    heldout = [q for q in dict.fromkeys(heldout_queries) if normalise(q) not in private_norm]
    members = list(dict.fromkeys(private_queries))
    if max_queries is not None:
        rng = random.Random(seed)
        members = rng.sample(members, min(max_queries, len(members)))
        heldout = rng.sample(heldout, min(max_queries, len(heldout)))
    if len(members) < 2 or len(heldout) < 2:
        raise InputError(f"the likelihood test needs at least 2 private and 2 held-out queries "
                         f"(have {len(members)} and {len(heldout)})")
    if loader is None:
        lm, tokenizer, kind = _load_causal(model)
    else:
        lm, tokenizer = loader(model)
        kind = "causal"
    with Progress() as progress:
        task = progress.add_task("scoring queries", total=len(members) + len(heldout))
        loss_m = per_token_losses(lm, tokenizer, members, batch_size=batch_size,
                                  progress=lambda n: progress.advance(task, n))
        loss_h = per_token_losses(lm, tokenizer, heldout, batch_size=batch_size,
                                  progress=lambda n: progress.advance(task, n))
    verdict = likelihood_statistic(loss_m, loss_h, z_threshold=z_threshold, auc_threshold=auc_threshold)
    private_stats, heldout_stats = _describe(loss_m), _describe(loss_h)
    return {"model": model, "kind": kind, "private": private_stats, "heldout": heldout_stats,
            "mean_gap": heldout_stats["mean"] - private_stats["mean"],
            "auc": verdict.auc, "z": verdict.z, "p_value": verdict.p_value, "flagged": verdict.flagged,
            "z_threshold": z_threshold, "auc_threshold": auc_threshold, "seed": seed,
            "statistic": "Mann-Whitney AUC of per-token NLL, P(loss(private) < loss(held-out)); flagged when "
                         "z > z_threshold and AUC >= auc_threshold"}


def _load_causal(name: str):
    from privret.models.generator import load_generator

    generator = load_generator(name)
    if generator.kind != "causal":
        raise InputError("the likelihood test needs a causal LM (a seq2seq model has no unconditional "
                         "likelihood of a query)", field="model")
    return generator.model, generator.tokenizer, generator.kind


def queries_of_split(dataset, split: str) -> list[str]:
    return [dataset.queries[q] for q in sorted(dataset.split(split)) if q in dataset.queries]
