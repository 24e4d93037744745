"""Measurements: retrieval quality (and, in later modules, similarity and privacy audits)."""
