"""Privacy audits of trained models, above the trainers: canary exposure of the DP generator, pretraining overlap."""
