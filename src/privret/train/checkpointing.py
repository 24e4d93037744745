"""Crash-safe checkpoints and step accounting for the DP training run (:mod:`privret.train.dp_run`, both DP trainers).

A crash must never let a ledger report fewer noisy updates than could have reached disk, and a resume must never
replay noise. Inside the output directory, until the final model replaces it: ``<out>/checkpoint/`` (parameters,
optimizer state, ledger; :func:`save_checkpoint`) and ``<out>/steps.jsonl``, the step log. Every process that trains
(a *branch*, started at step ``start`` from a checkpoint or 0) appends and fsyncs ``{release, branch, start, to}``
*before* any write that may put parameters updated by steps ``start+1 .. to`` on disk. So, whenever a kill lands,
the updates that could have reached disk number at most

    S = sum over branches of (largest ``to`` of the branch - its ``start``)

(:func:`distinct_steps`), and every ledger reports ``steps = S`` (:meth:`StepAccount.total`). A checkpoint the log
cannot account for (log missing, unreadable but for a torn last line, or naming no record of its step) or made under
another privacy plan is refused; only non-private runs store the sampler's RNG state. The budget registry hears of
the release (``planned``) before the first record and (``final``) once the model is in place (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from privret.errors import InputError
from privret.io import append_log_record, atomic_path, read_log_records, write_text_atomic
from privret.privacy.ledger import PrivacyLedger

STEP_LOG = "steps.jsonl"
CHECKPOINT_DIR = "checkpoint"

# Ledger fields a checkpoint must share with the run resuming it (the privacy plan and the data).
PLAN_KEYS = ("mechanism", "noise_multiplier", "sample_rate", "planned_steps", "unit", "n_units", "clip_norm",
             "data_hash", "model", "trainable", "delta", "accountant", "provenance", "part")
# Ledger fields a finished output must share with a run pointed at it again.
FINISHED_KEYS = ("mechanism", "noise_multiplier", "sample_rate", "planned_steps", "unit", "n_units", "clip_norm",
                 "data_hash", "model", "delta", "provenance", "part")


# --- the step log -------------------------------------------------------------------------------


def read_step_log(path: Path, *, private: bool, checkpoint: Path) -> list[dict]:
    """Records of the step log. A torn last line is a record whose fsync never returned, so the
    write it announced never began: it is dropped. Anything else unreadable refuses the resume."""
    if not path.exists():
        if private and checkpoint.exists():
            raise InputError("a checkpoint without a step log (written by an older privret?): cannot prove what "
                             "this run spent, refusing to resume (start again in a new directory)", path=checkpoint)
        return []
    return read_log_records(path, step_record,
                            unreadable="unreadable step log record: cannot prove what this run spent, "
                                       "refusing to resume")


def step_record(record) -> dict:
    """Validate one step log record (``ValueError`` if it is not one)."""
    if not (isinstance(record, dict) and {"release", "branch", "start", "to"} <= set(record)
            and isinstance(record["start"], int) and isinstance(record["to"], int)
            and 0 <= record["start"] <= record["to"]):
        raise ValueError("not a step log record")
    return record


def append_step_log(path: Path, record: dict) -> None:
    """Append ``record`` and fsync the log and its directory (the record is durable on return)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_log_record(path, json.dumps(record))  # replaces a torn record (see read_step_log)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def distinct_steps(records: Iterable[dict]) -> int:
    """sum over branches of (largest persisted step - the step the branch started from)."""
    furthest: dict[str, tuple[int, int]] = {}
    for r in records:
        start, to = furthest.get(r["branch"], (r["start"], r["start"]))
        furthest[r["branch"]] = (start, max(to, r["to"]))
    return sum(to - start for start, to in furthest.values())


@dataclass
class StepAccount:
    """This process's branch of a run's step log: what the run spent before, and what it may spend now.

    Open it with :meth:`open` before training; call :meth:`resume_from` with the checkpoint's step
    (if any), :meth:`persist` before every write of updated parameters, and take ledgers' step
    counts from :meth:`total`.
    """

    path: Path
    records: list[dict]
    secure: bool  # every branch so far (and this one) draws from the OS CSPRNG
    release_id: str
    branch: str = field(default_factory=lambda: uuid.uuid4().hex)
    start: int = 0

    @classmethod
    def open(cls, path: Path, *, private: bool, checkpoint: Path, secure: bool) -> StepAccount:
        """Read the log at ``path`` (see :func:`read_step_log`); a fresh run gets a new release id."""
        records = read_step_log(path, private=private, checkpoint=checkpoint)
        secure = secure and all(r.get("secure", False) for r in records)
        release_id = records[0]["release"] if records else uuid.uuid4().hex
        return cls(path=path, records=records, secure=secure, release_id=release_id)

    @property
    def spent_before(self) -> int:
        """Distinct noisy updates earlier branches may have put on disk."""
        return distinct_steps(self.records)

    def resume_from(self, step: int, *, private: bool) -> None:
        """Start this branch at the checkpoint of ``step``; refuse it if the log does not account for it."""
        if private and not any(r["to"] == step for r in self.records):
            raise InputError(f"the step log does not account for the checkpoint of step {step}; cannot prove "
                             "what this run spent, refusing to resume (start again in a new directory)",
                             path=self.path)
        self.start = step

    def total(self, step: int) -> int:
        """Distinct noisy updates that may be on disk once this branch has persisted ``step``."""
        return self.spent_before + (step - self.start)

    def persist(self, step: int) -> None:
        """Announce (durably) that parameters updated up to ``step`` may now be written."""
        append_step_log(self.path, {"release": self.release_id, "branch": self.branch, "start": self.start,
                                    "to": step, "secure": self.secure})


# --- checkpoints --------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    step: int
    rng_state: torch.Tensor | None  # the sampler's RNG state (non-private runs only)
    state: dict  # state.json: step, param_groups and whatever ``extra`` the trainer saved


def save_checkpoint(ckpt_dir: Path, params: Mapping[str, torch.Tensor], optimizer, ledger: PrivacyLedger, *,
                    step: int, rng: torch.Generator | None = None, extra: dict | None = None) -> None:
    """Parameters, Adam state and (non-private runs) the sampler's RNG state, all as safetensors;
    ``state.json`` (step, optimizer param groups, ``extra``) and the ledger; atomically as a whole."""
    from safetensors.torch import save_file

    with atomic_path(ckpt_dir) as staged:
        staged.mkdir()
        save_file({n: p.detach().contiguous() for n, p in params.items()}, str(staged / "params.safetensors"))
        tensors, groups = _flatten_optimizer(optimizer.state_dict())
        save_file(tensors, str(staged / "optimizer.safetensors"))
        state = {"step": step, "param_groups": groups, **(extra or {})}
        if rng is not None:
            save_file({"sampler": rng.get_state()}, str(staged / "rng.safetensors"))
        write_text_atomic(staged / "state.json", json.dumps(state, indent=2) + "\n")
        ledger.save(staged)


def load_checkpoint(ckpt_dir: Path, params: Mapping[str, torch.Tensor], optimizer, *, expected: PrivacyLedger,
                    keys: Iterable[str] = PLAN_KEYS) -> Checkpoint:
    """Restore params and optimizer in place. Refuse a checkpoint whose ledger differs from
    ``expected`` in one of ``keys`` (another privacy plan), or one from an older privret."""
    from safetensors.torch import load_file

    difference = first_difference(PrivacyLedger.load(ckpt_dir), expected, keys)
    if difference is not None:
        key, was, now = difference
        raise InputError(f"checkpoint was made with {key}={was!r}, this run has {now!r}; cannot resume", path=ckpt_dir)
    if not (ckpt_dir / "state.json").is_file():
        raise InputError("checkpoint from an older privret (no state.json, pickled optimizer); cannot resume it "
                         "safely, start again in a new directory", path=ckpt_dir)
    state = json.loads((ckpt_dir / "state.json").read_text(encoding="utf-8"))
    tensors = load_file(str(ckpt_dir / "params.safetensors"))
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(tensors[n])
    optimizer.load_state_dict(_unflatten_optimizer(load_file(str(ckpt_dir / "optimizer.safetensors")),
                                                   state["param_groups"]))
    rng_file = ckpt_dir / "rng.safetensors"
    return Checkpoint(step=int(state["step"]),
                      rng_state=load_file(str(rng_file))["sampler"] if rng_file.is_file() else None, state=state)


def check_finished(out_dir: Path, *, expected: PrivacyLedger, what: str,
                   keys: Iterable[str] = FINISHED_KEYS) -> PrivacyLedger:
    """The ledger of a finished output; refuse it if it was made under another plan (``what``: "a generator")."""
    saved = PrivacyLedger.load(out_dir)
    difference = first_difference(saved, expected, keys)
    if difference is not None:
        key, was, now = difference
        raise InputError(f"already holds {what} trained with {key}={was!r} (this run has {now!r}); "
                         "use another directory", path=out_dir)
    return saved


def first_difference(saved: PrivacyLedger, expected: PrivacyLedger,
                     keys: Iterable[str]) -> tuple[str, object, object] | None:
    """The first of ``keys`` in which a saved ledger and this run's differ, with both values, or None.

    Compared as published (:meth:`PrivacyLedger.published`): a saved ledger holds commitments of the data
    digests, which equal this run's exactly when the data and this installation's key are the same (a
    ledger from another installation, or one an older privret wrote with the raw digest, reads as other
    data: refused, never adopted)."""
    saved, expected = saved.published(), expected.published()
    for key in keys:
        if getattr(saved, key) != getattr(expected, key):
            return key, getattr(saved, key), getattr(expected, key)
    return None


def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], list[dict]]:
    tensors = {}
    for index, values in state["state"].items():
        for key, value in values.items():
            tensors[f"{index}.{key}"] = (value if isinstance(value, torch.Tensor) else torch.tensor(value)).contiguous()
    return tensors, state["param_groups"]


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], groups: list[dict]) -> dict:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": groups}
