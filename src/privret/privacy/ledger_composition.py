"""What releasing several artefacts together costs: their ledgers composed (:func:`compose_ledgers`), and a
run's models composed per privacy unit (:func:`run_composition`), by the rule of
:func:`privret.privacy.budget.compose`. A ledger made of parts counts part by part, and a part published
under several artefacts (post-processing of one release) counts once; non-private ledgers make the cost
infinite and are named apart.
"""

from __future__ import annotations

import math
from pathlib import Path

from privret.errors import InputError
from privret.privacy.budget import Composition, Release, compose
from privret.privacy.ledger import PrivacyLedger


def compose_ledgers(ledgers: list) -> Composition:
    """What releasing all these artefacts together costs (one unit; non-private ledgers make it inf)."""
    if any(not math.isfinite(ledger.epsilon) for ledger in ledgers):
        return Composition(epsilon=math.inf, delta=0.0, releases=len(ledgers), method="a non-private release")
    # A composed ledger (a chosen retriever, a synthetic set) counts part by part: its top level describes parts[0].
    # A part carried by several ledgers (one DP run under two chosen retrievers: post-processing) is one release and
    # counts once: published parts are told apart by the stamp PrivacyLedger.save gives each release. An unstamped
    # part (never saved, or saved before parts were stamped) always counts (conservative).
    parts, seen = [], set()
    for part in (part for ledger in ledgers for part in (ledger.parts or [ledger])):
        key = part.model_dump_json() if part.created_at else None
        if key is None or key not in seen:
            parts.append(part)
            seen.add(key)
    items = [Release.from_ledger(part, release_id=str(k), status="final") for k, part in enumerate(parts)]
    units = {r.unit for r in items}
    if len(units) > 1:
        raise InputError(f"cannot compose releases under different privacy units ({', '.join(sorted(units))})")
    return compose(items)


def run_composition(ledger_dirs: list[tuple[str, Path]]) -> dict:
    """What releasing every model of a run together costs; ``ledger_dirs``: (name, directory holding a ledger).

    The caller lists each release once (e.g. a generator, not also the synthetic sets and retrievers
    derived from it, which carry its ledger and are post-processing of it). Private ledgers are
    composed per privacy unit (:func:`compose_ledgers`); non-private ones are named apart.
    """
    ledgers = [(name, PrivacyLedger.load(directory)) for name, directory in ledger_dirs]
    private = [(name, ledger) for name, ledger in ledgers if ledger.is_private]
    result = {"releases": [name for name, _ in private],
              "non_private": [name for name, ledger in ledgers if not ledger.is_private]}
    by_unit: dict[str, list] = {}
    for _, ledger in private:
        by_unit.setdefault(ledger.unit, []).append(ledger)
    result["composition"] = {unit: compose_ledgers(items).model_dump(mode="json") for unit, items in by_unit.items()}
    return result


def run_composition_sentence(summary: dict) -> str:
    parts = [f"releasing all {c['releases']} DP models of this run together (unit '{unit}') costs "
             f"epsilon = {c['epsilon']:.3g}, delta = {c['delta']:.2g} ({c['method']})"
             for unit, c in summary["composition"].items()]
    text = "; ".join(parts) if parts else "no DP model in this run yet"
    if summary["non_private"]:
        text += ("; the non-private rows (" + ", ".join(summary["non_private"]) + ") are references with no "
                 "guarantee: releasing any of them voids the privacy of this data")
    return text[0].upper() + text[1:] + "."
