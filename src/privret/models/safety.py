"""Safe model loading: no pickle unless trusted, no network when offline.

Unpickling a file can run any code its author wrote (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``
are pickles; torch's ``weights_only`` loader narrows that but is still a parser of untrusted
input). privret writes only safetensors, and refuses to load a model directory whose weights
exist only as pickles unless the user passes ``--trust-remote-pickle`` (environment
``PRIVRET_TRUST_REMOTE_PICKLE=1``). ``trust_remote_code`` is never turned on.

Offline: with ``PRIVRET_OFFLINE=1`` (or ``HF_HUB_OFFLINE=1``) the Hugging Face hub client is put
in offline mode before any model is loaded, so a cached model loads without an HTTP request and
an uncached one fails with a clear error instead of a download.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from privret.errors import InputError

TRUST_PICKLE_ENV = "PRIVRET_TRUST_REMOTE_PICKLE"
_PICKLE_WEIGHTS = re.compile(r"(pytorch_model.*\.bin|.*\.(pt|pth|ckpt|pkl|pickle))")
_SAFE_WEIGHTS = re.compile(r".*\.(safetensors|gguf)")


def trust_pickle() -> bool:
    return os.environ.get(TRUST_PICKLE_ENV) == "1"


def set_trust_pickle(value: bool) -> None:
    if value:
        os.environ[TRUST_PICKLE_ENV] = "1"
    else:
        os.environ.pop(TRUST_PICKLE_ENV, None)


def offline() -> bool:
    return os.environ.get("PRIVRET_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"


def enforce_offline() -> None:
    """Put huggingface_hub in offline mode when the user asked for it (it reads the variable at import)."""
    if not offline():
        return
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return
    constants.HF_HUB_OFFLINE = True


def _local_dir(location: str) -> Path | None:
    path = Path(location)
    if path.is_dir():
        return path
    try:  # a hub id: inspect its cached snapshot, without any network access
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(location, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached: nothing local to inspect
        return None


def pickle_only_weights(directory: Path) -> list[Path]:
    """Pickled weight files in folders (top level and one below) that have no safetensors beside them."""
    found = []
    for folder in [directory, *(p for p in directory.iterdir() if p.is_dir())]:
        names = [p.name for p in folder.iterdir() if p.is_file()]
        if any(_SAFE_WEIGHTS.fullmatch(n) for n in names):
            continue
        found += [folder / n for n in names if _PICKLE_WEIGHTS.fullmatch(n) and n != "training_args.bin"]
    return found


def check_weights(location: str, name: str | None = None) -> None:
    """Refuse pickle-only weights unless trusted (see the module docstring)."""
    directory = _local_dir(location)
    if directory is None or trust_pickle():
        return
    pickles = pickle_only_weights(directory)
    if pickles:
        raise InputError(f"model '{name or location}' has weights only as pickle files ({pickles[0].name}); loading a "
                         "pickle can run code hidden in it. Convert it to safetensors, or trust pickles if you trust "
                         "where it comes from", path=pickles[0], field="trust_remote_pickle")
