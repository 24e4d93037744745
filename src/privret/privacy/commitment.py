"""What a published artefact may say about which private data it came from: a keyed commitment.

A digest of the private log (``data_hash``, the budget registry's ``dataset_id``) is an exact function of every
record: written beside a DP model, it would let anyone who knows all records but one test each candidate for the
last. A file meant to leave the operator's machine (a ledger, a synthetic set's manifest, a stage fingerprint)
carries instead ``commit(v) = "hmac-sha256:" + HMAC-SHA256(k, v)``, with ``k`` a 32-byte secret of this
installation drawn from ``os.urandom`` on first use and kept in ``<PRIVRET_CACHE>/ledger.key`` (default
``~/.cache/privret``; mode 0600; ``$PRIVRET_LEDGER_KEY`` names another file).

HMAC with a secret key is a pseudorandom function (Bellare 2006), so without ``k`` the commitment is computationally
independent of the data, while privret still compares equal values exactly (resume, stage fingerprints). The raw
digests stay in memory and in the budget registry (whose files they name, so releases compose whatever the key).
Losing the key never under-counts the budget: artefacts made with the old key are refused for resume or reuse.
See docs/privacy.md, section "What a ledger says about the data: a commitment, not a hash".
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

PREFIX = "hmac-sha256:"
KEY_BYTES = 32
KEY_ENV = "PRIVRET_LEDGER_KEY"


def key_file() -> Path:
    """``$PRIVRET_LEDGER_KEY``, else ``$PRIVRET_CACHE/ledger.key`` (``~/.cache/privret/ledger.key``)."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV])
    return Path(os.environ.get("PRIVRET_CACHE", Path.home() / ".cache" / "privret")) / "ledger.key"


def _key() -> bytes:
    """This installation's key, created on first use: written whole to a private temporary file, then
    linked into place (a concurrent creator's key wins; a crash leaves no half-written key)."""
    path = key_file()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(os.urandom(KEY_BYTES))
                handle.flush()
                os.fsync(handle.fileno())
            os.link(staged, path)
        except FileExistsError:
            pass
        finally:
            staged.unlink(missing_ok=True)
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise RuntimeError(f"{path}: a privret ledger key has {KEY_BYTES} bytes, this file {len(key)}; "
                           "restore it, or remove it to start a new key (artefacts made with the old one then "
                           "count as other data)")
    return key


def is_committed(value: str) -> bool:
    return value.startswith(PREFIX)


def commit(value: str) -> str:
    """The keyed commitment of a data digest (see the module docstring); ``""`` and commitments are
    returned as they are, so committing twice is committing once."""
    if not value or is_committed(value):
        return value
    return PREFIX + hmac.new(_key(), value.encode("utf-8"), hashlib.sha256).hexdigest()
