"""Loading Hugging Face models safely and with clear errors.

``trust_remote_code`` is always off and weights are read from safetensors when the repository
has them; pickle-only weights need ``--trust-remote-pickle`` and offline mode is enforced
(:mod:`privret.models.safety`); a load failure (missing files, no network, a damaged local directory) becomes a
one-line :class:`~privret.errors.ModelUnavailableError` that says how to make the model available.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from safetensors import SafetensorError

from privret.errors import ModelUnavailableError
from privret.models.registry import resolve
from privret.models.safety import check_weights, enforce_offline

T = TypeVar("T")


def load_pretrained(name: str, loader: Callable[[str], T]) -> T:
    """Resolve ``name`` and call ``loader(path_or_id)``, translating failures into a clear error."""
    enforce_offline()
    location = resolve(name)
    check_weights(location, name)
    try:
        return loader(location)
    except (OSError, SafetensorError, ValueError) as err:
        reason = (str(err).splitlines() or [type(err).__name__])[0]
        if Path(location).is_dir():  # a local directory: a truncated weights file, a malformed JSON file of it
            raise ModelUnavailableError(f"cannot read the model ({reason}): a damaged or incomplete model "
                                        "directory?", path=location) from None
        if not isinstance(err, OSError):
            raise
        raise ModelUnavailableError(
            f"cannot load model '{name}' ({reason}); pass a local directory, or download it "
            f"first with `hf download {name}` on a machine with network") from None
