"""Privacy audits of trained models, above the trainers: canary exposure of the DP generator, pretraining
overlap, and embedding inversion (what Fed-Negative's exchanged embeddings reveal)."""
