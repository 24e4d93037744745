"""What a published artefact may say about which private data it came from: a keyed commitment.

privret identifies the private data it reads by digests of it: ``data_hash`` (SHA-256 of the files
read) and the budget registry's ``dataset_id`` (SHA-256 of the set of records). Both are exact,
deterministic functions of every record of the log. Written beside a DP model, either would break
the guarantee the model's ledger states: someone who knows all records but one, and has a short
list of candidates for the last (a neighbouring log in the DP sense), hashes each candidate log and
finds the true one with certainty. No noise protects a hash.

So a file meant to leave the operator's machine (the ledger beside a model, a synthetic set's
manifest, a pipeline stage's fingerprint) carries instead::

    commit(v) = "hmac-sha256:" + HMAC-SHA256(k, v)

with ``k`` a 32-byte secret of this installation, drawn from ``os.urandom`` the first time it is
needed and kept in ``<PRIVRET_CACHE>/ledger.key`` (default ``~/.cache/privret``; file mode 0600;
``$PRIVRET_LEDGER_KEY`` names another file). HMAC with a secret key is a pseudorandom function
(Bellare 2006), so without ``k`` the commitment is computationally independent of the data: it
adds nothing to what the (epsilon, delta) guarantee already allows. With ``k`` the operator's
privret still compares two artefacts' data exactly (resume, re-run of a finished output, stage
fingerprints): the commitments of equal values are equal.

The raw digests stay on the operator's side: in memory and in
the budget registry (whose files are named by them, so that releases on one log compose whatever
key is in use). Losing the key never under-counts the budget; it only makes artefacts made with the
old key look like other data, and privret then refuses to resume or reuse them (conservative).
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
