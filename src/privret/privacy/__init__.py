"""Differential privacy: accounting, the privacy ledger, Poisson unit sampling, per-unit clipping."""
