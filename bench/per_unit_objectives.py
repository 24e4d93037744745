"""Which per-unit training objective gains *without* noise? (issue 12: a direct DP recipe needs one first.)

Direct DP clips each privacy unit's gradient, so a unit's loss may depend only on its own pairs and on public
data. The in-batch softmax (other units' documents as negatives) is not such a loss; ``public-negatives`` is,
and loses on the SQuAD proxy even with a quarter of the noise (docs/benchmarks.md). This script trains the
public encoder WITHOUT DP (no clipping, no noise) on a sample of a BEIR log with one objective at a time and
scores it on a validation split carved from the log's own training articles (never the test split):

* ``in-batch``: the non-private reference (not per-unit);
* ``shared``: the unit's query against its document and M public documents drawn per step for all units,
  no gradient through them (what ``privret retriever train --dp public-negatives`` clips);
* ``shared-grad``: the same with the gradient flowing through the shared negatives (not per-unit: a shared
  document's gradient mixes all units' terms);
* ``own``: K public documents drawn for each unit alone, with gradient (per-unit);
* ``own-hard``: K of the top-ranked public documents for the unit's query by the *public* encoder, gold
  documents left out, with gradient (per-unit: a function of the unit's own query and public data).

The validation split: the log's training articles (document ids ``<article>-<paragraph>``, as
``privret data squad-beir`` writes them) ordered by sha256("validation:" + article); the first
``--validation-articles`` give the validation questions, searched over the whole corpus; the training sample is
``--train-queries`` questions of the others. Writes ``<out>/result.json`` (NDCG@10, the delta against the public
encoder with a paired bootstrap 95% CI over the validation questions) and the per-query scores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from privret.data.beir import load_beir
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.evaluate.statistics import paired_bootstrap_ci
from privret.models.encoder import embed, load_encoder
from privret.models.trainable import make_trainable
from privret.retrieval.embedding import corpus_embeddings, encode
from privret.retrieval.metrics import mean_metrics, per_query_metrics
from privret.train.hard_negatives import mine_candidates

OBJECTIVES = ("in-batch", "shared", "shared-grad", "own", "own-hard")


def carve(ds, n_validation_articles: int, n_train: int, seed: int):
    """(training units [(query, gold doc ids)], validation qrels), split by article."""
    train = ds.split("train")
    article = {q: next(iter(rels)).split("-")[0] for q, rels in train.items()}
    order = sorted(set(article.values()), key=lambda a: hashlib.sha256(f"validation:{a}".encode()).hexdigest())
    held = set(order[:n_validation_articles])
    validation = {q: rels for q, rels in train.items() if article[q] in held}
    rest = sorted(q for q in train if article[q] not in held)
    random.Random(seed).shuffle(rest)
    units = [(q, sorted(d for d, r in train[q].items() if r > 0)) for q in rest[:n_train]]
    return units, validation


def write_log(units, base: Path, dst: Path) -> int:
    """Write the carved training units as a BEIR log that ``privret retriever train`` reads: ``qrels/train.tsv`` holds
    the rows of ``base``'s training qrels whose question is a unit; the corpus, the questions, the manifest and the
    validation and test qrels are links to ``base``'s. Returns the number of training questions written."""
    keep = {q for q, _ in units}
    (dst / "qrels").mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl", "queries.jsonl", "manifest.json", "qrels/test.tsv", "qrels/validation.tsv"):
        if not (dst / name).exists():
            (dst / name).symlink_to((base / name).resolve())
    header, *rows = (base / "qrels" / "train.tsv").read_text().splitlines()
    kept = [r for r in rows if r.split("\t")[0] in keep]
    tmp = dst / "qrels" / "train.tsv.tmp"
    tmp.write_text("\n".join([header, *kept]) + "\n")
    tmp.replace(dst / "qrels" / "train.tsv")
    return len(kept)


def evaluate(model, ds, doc_ids, qrels) -> dict:
    model.eval()
    D = torch.from_numpy(corpus_embeddings(model, ds.corpus, bf16=False))
    qids = sorted(qrels)
    Q = torch.from_numpy(encode(model, [ds.queries[q] for q in qids], bf16=False))
    scores, hits = (Q @ D.T).topk(100, dim=1)
    run = {q: {doc_ids[h]: float(s) for s, h in zip(scores[i].tolist(), hits[i].tolist())} for i, q in enumerate(qids)}
    return per_query_metrics(run, qrels)


def hard_candidates(model, ds, doc_ids, units, depth: int) -> list[list[int]]:
    """For each unit, the corpus positions of the public encoder's top ``depth`` documents, gold left out: the
    trainer's own mining (:func:`privret.train.hard_negatives.mine_candidates`), one row per gold document."""
    rows = [QueryDocPair(query=ds.queries[q], doc_id=g, query_id=q) for q, gold in units for g in gold]
    groups, first = [], []
    for q, gold in units:
        first.append(sum(len(g) for g in groups))
        groups.append(list(range(first[-1], first[-1] + len(gold))))
    pairs = TrainingPairs(pairs=rows, corpus=ds.corpus)
    cands = mine_candidates(model, pairs, groups, [ds.corpus[d] for d in doc_ids], depth)
    return [cands[r] for r in first]


def batch_loss(model, ds, doc_ids, units, rows, a, rng, hard) -> torch.Tensor:
    queries = [ds.queries[units[r][0]] for r in rows]
    golds = [units[r][1] for r in rows]
    text = lambda j: ds.corpus[doc_ids[j]].full_text  # noqa: E731
    col = {d: i for i, d in enumerate(doc_ids)}
    q = embed(model, queries, max_length=64).float()
    d = embed(model, [ds.corpus[g[0]].full_text for g in golds], max_length=a.max_doc_tokens).float()
    if a.objective == "in-batch":
        same = torch.tensor([[ga[0] == gb[0] for gb in golds] for ga in golds]) & ~torch.eye(len(rows), dtype=torch.bool)
        logits = (q @ d.T / a.tau).masked_fill(same, float("-inf"))
        return F.cross_entropy(logits, torch.arange(len(rows)))
    pos = (q * d).sum(1, keepdim=True)
    if a.objective in ("shared", "shared-grad"):
        picks = rng.sample(range(len(doc_ids)), a.negatives)
        with torch.set_grad_enabled(a.objective == "shared-grad"):
            n = embed(model, [text(j) for j in picks], max_length=a.max_doc_tokens).float()
        mask = torch.tensor([[doc_ids[j] in set(g) for j in picks] for g in golds])
        neg = (q @ n.T).masked_fill(mask, float("-inf"))
    else:
        picks = []
        for r, g in zip(rows, golds):
            gold = {col[x] for x in g}
            choice = rng.sample(hard[r], min(a.negatives, len(hard[r]))) if a.objective == "own-hard" else []
            while len(choice) < a.negatives:
                j = rng.randrange(len(doc_ids))
                if j not in gold and j not in choice:
                    choice.append(j)
            picks.append(choice)
        n = embed(model, [text(j) for p in picks for j in p], max_length=a.max_doc_tokens).float()
        n = n.view(len(rows), a.negatives, -1)
        neg = torch.einsum("bd,bkd->bk", q, n)
    logits = torch.cat([pos, neg], dim=1) / a.tau
    return F.cross_entropy(logits, torch.zeros(len(rows), dtype=torch.long))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", help="result directory (required unless --write-log)")
    ap.add_argument("--objective", choices=OBJECTIVES, help="required unless --write-log")
    ap.add_argument("--trainable", default="all")
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--negatives", type=int, default=4, help="per unit (own*) or per step (shared*)")
    ap.add_argument("--hard-depth", type=int, default=30)
    ap.add_argument("--tau", type=float, default=0.05)
    ap.add_argument("--max-doc-tokens", type=int, default=256)
    ap.add_argument("--validation-articles", type=int, default=4)
    ap.add_argument("--train-queries", type=int, default=807)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--also-test", action="store_true",
                    help="also score the test split (reporting only: nothing may be chosen from it)")
    ap.add_argument("--write-log", metavar="DIR",
                    help="write the carved training units as a BEIR log in DIR and stop: the data "
                         "for replaying this run in the DP trainer (bench/public_negatives.sh)")
    ap.add_argument("--log-base", metavar="DIR",
                    help="with --write-log: the BEIR directory whose corpus, questions and qrels the log links to")
    a = ap.parse_args()
    if a.write_log:
        if not a.log_base:
            ap.error("--write-log needs --log-base")
        units, _ = carve(load_beir(a.data, ["train"]), a.validation_articles, a.train_queries, a.seed)
        print(f"{a.write_log}: {write_log(units, Path(a.log_base), Path(a.write_log))} training questions")
        return
    if not (a.out and a.objective):
        ap.error("--out and --objective are required (unless --write-log)")
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    t0 = time.time()
    ds = load_beir(a.data, ["train", "test"] if a.also_test else ["train"])
    doc_ids = list(ds.corpus)
    units, validation = carve(ds, a.validation_articles, a.train_queries, a.seed)
    print(f"{len(units)} training units, {len(validation)} validation questions", flush=True)
    model = load_encoder("minilm-l6")
    zs_path = Path(a.data) / f"zero-shot-validation-{a.validation_articles}.json"
    if not zs_path.exists():
        zs_path.write_text(json.dumps(evaluate(model, ds, doc_ids, validation)))
    zero_shot = json.loads(zs_path.read_text())
    hard = hard_candidates(model, ds, doc_ids, units, a.hard_depth) if a.objective == "own-hard" else None
    params = list(make_trainable(model, a.trainable, lora_rank=a.lora_rank).values())
    optimizer = torch.optim.AdamW(params, lr=a.lr)
    steps = max(1, round(a.epochs * len(units) / a.batch))
    order: list[int] = []
    model.train()
    for step in range(1, steps + 1):
        if len(order) < a.batch:
            extra = list(range(len(units)))
            rng.shuffle(extra)
            order += extra
        rows, order = order[: a.batch], order[a.batch:]
        loss = batch_loss(model, ds, doc_ids, units, rows, a, rng, hard)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == steps:
            print(f"step {step}/{steps} loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)
    per_query = evaluate(model, ds, doc_ids, validation)
    qids = sorted(per_query)
    lo, hi = paired_bootstrap_ci([zero_shot[q]["ndcg@10"] for q in qids], [per_query[q]["ndcg@10"] for q in qids])
    ndcg, zs = mean_metrics(per_query)["ndcg@10"], mean_metrics(zero_shot)["ndcg@10"]
    result = {"args": vars(a), "validation_ndcg10": ndcg, "zero_shot": zs, "delta": ndcg - zs, "ci95": [lo, hi],
              "seconds": round(time.time() - t0)}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.also_test:
        test = evaluate(model, ds, doc_ids, ds.split("test"))
        result["test_ndcg10"] = mean_metrics(test)["ndcg@10"]
        (out / "per_query_test.json").write_text(json.dumps(test))
    (out / "per_query.json").write_text(json.dumps(per_query))
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "args"}), flush=True)


if __name__ == "__main__":
    main()
