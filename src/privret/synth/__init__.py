"""Sampling DP synthetic queries for public documents."""
