"""privret: dense retrieval trained on private query logs with differential privacy."""

__version__ = "0.1.0"
