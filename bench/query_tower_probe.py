"""Probe: DP training of the *query tower only*, the documents frozen at the public encoder (issue 12).

A step of the shared-tower regime (`--dp public-negatives --hard-negatives 2 --trainable bias-top:3`) costs
minutes on one CPU thread because every sampled unit's positive and hard negatives run through the trained
layers. If only the query encoder trains, every document embedding is a constant computed once by the public
encoder, a step embeds only the sampled queries, and every public document can be a negative: row i's loss is
l_i = -log softmax over [cos(q_i, d_i), cos(q_i, n_j) for each corpus document n_j not a positive of i's
unit] / t. It depends only on unit u's own queries, its positives' (public-encoder) embeddings and the public
corpus, so per-unit clipping gives Delta = C and the step releases sum_u clip_C(grad_u) + N(0, (sigma C)^2 I)
with sigma from the accountant for T steps at q = batch / n (the DP core's ghost norms and book-keeping,
:class:`privret.privacy.ghost_norms.GhostNorms`, on the query slot only; Poisson sampling as the accountant
assumes). The released model would be asymmetric (trained query tower, public document tower).

This is a probe, not a product path: it evaluates on a BEIR directory's validation split (queries by the
trained tower, documents by the public one) and prints NDCG@10 every --eval-every steps and at the end;
--epsilon 0 switches the noise off (NOT DP: the clipped steps alone, a diagnosis). What it prints each step (the
sampled batch size, the batch's loss and clipped fraction) is computed from the private batch without noise: NOT
DP, for a public proxy log only. Results and commands: docs/benchmarks.md, "The query tower alone".
"""
import argparse
import time

import torch

from privret.data.beir import load_beir
from privret.data.pairs import pairs_from_beir
from privret.models.encoder import load_encoder
from privret.models.trainable import make_trainable
from privret.retrieval.embedding import corpus_embeddings
from privret.retrieval.metrics import per_query_metrics, mean_metrics
from privret.retrieval.index import build_index, top_k
from privret.privacy.ghost_norms import GhostNorms
from privret.privacy.accounting import calibrate_noise, default_delta
from privret.train.clipped_sums import _encode, public_negative_losses
from privret.train.dp_parallel import set_noisy_mean
from privret.distributed import SINGLE
from privret.models.frozen_prefix import frozen_prefix

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--data", required=True, help="BEIR directory: train split (the log), --eval-split scored")
ap.add_argument("--eval-split", default="validation")
ap.add_argument("--epsilon", type=float, default=8, help="0: no noise (NOT DP)")
ap.add_argument("--steps", type=int, default=48)
ap.add_argument("--batch", type=float, default=512, help="expected units per step (q = batch / n)")
ap.add_argument("--clip", type=float, default=1.0, help="C per unit")
ap.add_argument("--lr", type=float, default=2e-3, help="Adam")
ap.add_argument("--trainable", default="bias-top:3", help="of the query tower: top:K or bias-top:K")
ap.add_argument("--tau", type=float, default=0.05, help="softmax temperature")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--eval-every", type=int, default=0)
ap.add_argument("--pb", type=int, default=128, help="units per forward pass (memory only)")
ap.add_argument("--cache-dir", default=None, help="the public encoder's corpus embeddings (privret.retrieval.embedding)")
a = ap.parse_args()
torch.manual_seed(a.seed)  # Poisson sampling (torch.rand below); the noise has its own generator
noise_rng = torch.Generator().manual_seed(a.seed + 1)
ds = load_beir(a.data)
pairs = pairs_from_beir(ds, "train")
units = pairs.units("query")
n = len(units)
q = min(1.0, a.batch / n)
delta = default_delta(n)
sigma = 0.0 if a.epsilon <= 0 else calibrate_noise(target_epsilon=a.epsilon, delta=delta, sample_rate=q, steps=a.steps)
print(f"n={n} q={q:.4f} steps={a.steps} sigma={sigma:.3f}", flush=True)
base = load_encoder("minilm-l6", max_seq_length=256)
doc_ids = list(ds.corpus); pos_of = {d: i for i, d in enumerate(doc_ids)}
t0 = time.time()
E = torch.from_numpy(corpus_embeddings(base, ds.corpus, bf16=False, cache_dir=a.cache_dir))
print(f"corpus {len(doc_ids)} embedded {time.time()-t0:.0f}s", flush=True)
model = load_encoder("minilm-l6", max_seq_length=256)
params = make_trainable(model, a.trainable)
plist = list(params.values())
opt = torch.optim.Adam(plist, lr=a.lr)
unit_pos = [sorted({pos_of[pairs.pairs[r].doc_id] for r in rows}) for rows in units]

def evaluate(split):
    model.eval()
    qrels = ds.split(split); qids = [x for x in qrels if x in ds.queries]
    with torch.no_grad():
        pre = frozen_prefix(model)
        Q = pre.encode([ds.queries[x] for x in qids], max_length=64) if pre else None
    idx = build_index(E.numpy(), None)
    s, h = top_k(idx, Q, 100)
    run = {x: {doc_ids[j]: float(v) for v, j in zip(s[i], h[i]) if j >= 0} for i, x in enumerate(qids)}
    model.train()
    return mean_metrics(per_query_metrics(run, qrels))["ndcg@10"]

if frozen_prefix(model) is None:
    ap.error("--trainable must freeze the embeddings and lower layers (top:K or bias-top:K)")
print("start", evaluate(a.eval_split), flush=True)
model.train()
for step in range(a.steps):
    t = time.time()
    chosen = (torch.rand(n) < q).nonzero().flatten().tolist()
    total = [torch.zeros_like(p) for p in plist]; nclip = 0; losses = []
    for lo in range(0, len(chosen), a.pb):
        part = chosen[lo:lo + a.pb]
        rows = [(k, r) for k, u in enumerate(part) for r in units[u]]
        uo = torch.tensor([k for k, _ in rows])
        texts = [pairs.pairs[r].query for _, r in rows]
        pos = torch.tensor([pos_of[pairs.pairs[r].doc_id] for _, r in rows])
        mask = torch.zeros(len(rows), len(doc_ids), dtype=torch.bool)
        for i, (k, _) in enumerate(rows):
            mask[i, unit_pos[part[k]]] = True
        tr = GhostNorms(model)
        try:
            tr.slot = "q"
            e_q = _encode(model, texts, 64)
            tr.slot = None
            l = public_negative_losses(e_q, E[pos], E, a.tau, mask=mask)
            cot = torch.autograd.grad(l.sum(), [e_q], retain_graph=True)
            sq = tr.group_sq_norms([e_q], list(cot), {"q": uo}, len(part), keep_deltas=True)
            norms = sq.clamp_min(0).sqrt() * (1 + 1e-5)
            f = (a.clip / norms.clamp_min(1e-12)).clamp(max=1.0)
            out = tr.weighted_grads(plist, {"q": f[uo].detach()})
        finally:
            tr.remove()
        total = [x + y for x, y in zip(total, out)]; nclip += int((norms > a.clip).sum()); losses.append(l.detach())
    set_noisy_mean(plist, total, std=sigma * a.clip, expected_batch=q * n, rng=noise_rng, group=SINGLE)
    opt.step(); opt.zero_grad()
    loss = torch.cat(losses).mean().item() if losses else float("nan")
    msg = f"step {step+1} |B|={len(chosen)} loss={loss:.3f} clipped={nclip/max(1, len(chosen)):.2f} {time.time()-t:.1f}s"
    if a.eval_every and (step + 1) % a.eval_every == 0:
        msg += f" val={evaluate(a.eval_split):.4f}"
    print(msg, flush=True)
print("final", a.eval_split, evaluate(a.eval_split), flush=True)
