"""Carry an interrupted training run to another machine: ``park`` copies what its resume needs into a folder that
can be committed, ``restore`` puts it back into a run directory on the new machine, where the run's own command
with ``--resume`` continues it.

Why: a work directory here does not outlive the machine, and a direct DP run on SciFact takes longer than one session
of the 2-core CPU. What a resume needs is small: the run files of :data:`privret.train.dp_run.RUN_FILES` (the
checkpoint: trainable parameters, Adam state, the ledger, for a non-private run the sampler's RNG state; the step
log; a pipeline stage's record), a few kB for BitFit and LoRA regimes. Caches (the public encoder's corpus
embeddings, the frozen-prefix activations) are rebuilt by the resumed run.

Privacy (docs/privacy.md, "Crash and resume"): the parked step log is the one the run's accounting reads, so the
resumed run charges every noisy update any earlier process announced, none twice, and draws fresh noise. Two rules
keep that true across machines:

* ``park`` takes the run's lock (:class:`privret.runlock.RunLock`), so a live run cannot be parked: a copy taken
  while it still trains would miss the steps it announces afterwards, which a resume elsewhere would then
  under-count. Stop the run first (kill it; its checkpoint and step log are written atomically and fsynced);
* a run directory is restored from one parked copy, once, and the copy is deleted from the repository when the run
  finishes: two machines resuming one checkpoint would each release their own continuation, and the ledger of
  either would count only its own branch.

The budget registry is not carried (bench scripts keep theirs in the work directory, rebuilt on each machine): the
resumed run records its release there again under the same release id.

    python bench/park_run.py park runs/s39/scifact/RUN bench/parked/RUN
    python bench/park_run.py restore bench/parked/RUN runs/s39/scifact/RUN
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

from privret.errors import InputError
from privret.io import atomic_path, write_text_atomic
from privret.runlock import RunLock, recover_directory
from privret.train.checkpointing import CHECKPOINT_DIR, STEP_LOG
from privret.train.dp_run import RUN_FILES

MANIFEST = "PARKED.json"


def _files(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` by its relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def park(run_dir: Path, parked: Path) -> dict:
    """Copy the resumable state of the stopped run ``run_dir`` to ``parked`` (written whole or not at all) with a
    manifest of its files' hashes and the checkpoint's step; refuse a live run, a finished one, or a directory that
    holds no checkpoint and step log. Under the run's lock, what a kill mid-write left is first recovered as the
    resume itself would (:func:`privret.runlock.recover_directory`)."""
    if parked.exists():
        raise InputError("already exists: park into a new folder", path=parked)
    with RunLock(run_dir):  # no live run can announce steps while its files are copied
        recover_directory(run_dir)
        recover_directory(run_dir / CHECKPOINT_DIR)
        if not (run_dir / CHECKPOINT_DIR / "state.json").is_file() or not (run_dir / STEP_LOG).is_file():
            raise InputError("no interrupted run here (it needs a checkpoint and a step log)", path=run_dir)
        extra = sorted(p.name for p in run_dir.iterdir() if p.name not in RUN_FILES)
        if extra:
            raise InputError(f"holds {', '.join(extra)} besides an interrupted run's files (finished, or not a run "
                             "directory): nothing to park", path=run_dir)
        with atomic_path(parked) as staged:
            staged.mkdir()
            for name in RUN_FILES:
                source = run_dir / name
                if source.is_dir():
                    shutil.copytree(source, staged / name)
                elif source.is_file():
                    shutil.copy2(source, staged / name)
            state = json.loads((staged / CHECKPOINT_DIR / "state.json").read_text(encoding="utf-8"))
            manifest = {"source": str(run_dir), "checkpoint_step": state["step"], "files": _files(staged)}
            write_text_atomic(staged / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def restore(parked: Path, run_dir: Path) -> dict:
    """Put the parked copy ``parked`` back as the run directory ``run_dir`` (which must not exist), after checking
    every file against the manifest."""
    manifest_file = parked / MANIFEST
    if not manifest_file.is_file():
        raise InputError(f"no {MANIFEST}: not a parked run", path=parked)
    manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    found = {k: v for k, v in _files(parked).items() if k != MANIFEST}
    if found != manifest["files"]:
        changed = sorted(set(found.items()) ^ set(manifest["files"].items()))
        raise InputError(f"the parked files differ from {MANIFEST} ({changed[0][0]} first): refusing to resume from "
                         "them", path=parked)
    if run_dir.exists():
        raise InputError("already exists: a run is restored into a new directory only", path=run_dir)
    with atomic_path(run_dir) as staged:
        shutil.copytree(parked, staged, ignore=shutil.ignore_patterns(MANIFEST))
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, first, second in (("park", "run_dir", "parked"), ("restore", "parked", "run_dir")):
        command = sub.add_parser(name)
        command.add_argument(first, type=Path)
        command.add_argument(second, type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "park":
            manifest = park(args.run_dir, args.parked)
            print(f"parked {args.run_dir} at its step-{manifest['checkpoint_step']} checkpoint in {args.parked}")
        else:
            manifest = restore(args.parked, args.run_dir)
            print(f"restored {args.run_dir} from {args.parked} (step-{manifest['checkpoint_step']} checkpoint); "
                  "resume it with its own command and --resume, then delete the parked copy")
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
