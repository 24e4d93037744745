"""Release a fine-tuned retriever interpolated with its public base (WiSE-FT): post-processing, no privacy cost.

``theta = (1 - weight) theta_base + weight theta_tuned`` (:func:`privret.models.wise_ft.interpolate`).
The base is public and ``weight`` must be fixed without the private log (a priori, or on a public proxy), so
the output is a function of the tuned model alone and carries its ledger unchanged. Choosing ``weight`` *with*
the private log is a different release: that is ``privret retriever select``
(:mod:`privret.train.private_selection`), which spends epsilon on the choice.

The output directory holds the model, the tuned model's ``privacy_ledger.json`` and training settings,
``interpolation.json`` (base, source, weight) and a model card.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from privret.errors import InputError
from privret.io import atomic_path, write_json_atomic
from privret.models.wise_ft import load_interpolated
from privret.models.model_card import SETTINGS_FILES, write_model_card
from privret.privacy.ledger import PrivacyLedger, has_ledger, require_public
from privret.runlock import RunLock

INTERPOLATION_FILE = "interpolation.json"


def save_interpolated(source: str | Path, out_dir: str | Path, *, base: str, weight: float,
                      max_seq_length: int = 256) -> PrivacyLedger:
    """Write ``(1 - weight) base + weight source`` to ``out_dir`` (atomic) with ``source``'s ledger; returns it."""
    source, out_dir = Path(source), Path(out_dir)
    if out_dir.exists():
        raise InputError("already exists (remove it or choose another output)", path=out_dir)
    if not has_ledger(source):
        raise InputError("has no privacy_ledger.json: not a retriever privret trained", path=source)
    if not 0.0 < weight <= 1.0:
        raise InputError(f"{weight:g} is not in (0, 1] (0 is the base model itself)", field="weight")
    require_public(base, field="base", use="interpolation (the output carries only the source's ledger)")
    ledger = PrivacyLedger.load(source)
    mixed = load_interpolated(str(source), weight, base=base, max_seq_length=max_seq_length)
    with RunLock(out_dir, what="retriever directory"), atomic_path(out_dir) as staged:
        mixed.save(str(staged), safe_serialization=True)
        ledger.save(staged)
        for name in SETTINGS_FILES:  # the tuned model's training settings, for the card
            if (source / name).is_file():
                shutil.copyfile(source / name, staged / name)
        write_json_atomic(staged / INTERPOLATION_FILE, {"method": "wise-ft", "base": base,
                                                        "source": str(source), "weight": weight})
        write_model_card(staged)
    return ledger
