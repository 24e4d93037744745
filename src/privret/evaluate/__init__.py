"""Measurements of trained models and synthetic data: retrieval quality over several datasets, its statistics, and synthetic-query similarity."""
