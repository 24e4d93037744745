"""The canaries of an exposure audit: made-up private pairs whose queries carry random secrets, and the
training pairs with them inserted (Carranza et al., section 6.3).

A canary is a pair (document the generator reads, query it is trained to write) whose query is a random private
query plus a *secret*, a uniformly random 10-digit string; the secret is on the query side, what is private and
what the generator emits. Three kinds differ by the document:

* ``random-string``: a fresh random 10-digit string;
* ``own-document``: the random query's own relevant document;
* ``random-doc``: an unrelated random corpus document.

Each canary is inserted ``k`` times (``k`` in {1, 10, 100} by default) into the private pairs; each trial also
draws one *control* canary per kind that is never inserted (``k = 0``). Rank, exposure and leaks
(:mod:`privret.audit.canary_statistics`) follow Carlini et al. 2019, "The Secret Sharer". See
docs/audits-canaries.md, section "Protocol".
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.errors import InputError

KINDS = ("random-string", "own-document", "random-doc")
SECRET_DIGITS = 10
CANARY_PREFIX = "canary-"


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
                         field="subsample")
    sources = rng.sample(sorted(by_text), needed)
    if fits is not None:
        spare_rng = random.Random(f"privret-canaries/spare/{seed}/{trial}")
        spare = [q for q in spare_rng.sample(sorted(by_text), len(by_text))
                 if q not in sources and fits(f"{q} {'0' * SECRET_DIGITS}")]
        sources = [q if fits(f"{q} {'0' * SECRET_DIGITS}") else spare.pop(0) if spare else None for q in sources]
        if None in sources:
            raise InputError(f"fewer than {needed} private queries are short enough to carry a 10-digit secret "
                             "within the generator's max_query_tokens", field="subsample")
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


def subsample_pairs(pairs: TrainingPairs, n: int | None, seed: int) -> TrainingPairs:
    """``n`` rows drawn uniformly without replacement (seeded), in their original order."""
    if n is None or n >= len(pairs.pairs):
        return pairs
    keep = sorted(random.Random(f"privret-subsample/{seed}").sample(range(len(pairs.pairs)), n))
    return TrainingPairs(pairs=[pairs.pairs[i] for i in keep], corpus=pairs.corpus,
                         inline_doc_ids=pairs.inline_doc_ids)
