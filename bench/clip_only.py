"""Diagnosis, NOT a DP release: run ``privret retriever train --dp ...`` with the noise switched off.

Everything a DP run does (Poisson sampling, per-unit clipping, the division by the expected batch, the optimizer)
happens, but the Gaussian noise has standard deviation 0, so the output shows what clipping and the step schedule
alone do to the objective; the difference to the DP run is what the noise costs. The output directory still gets
the DP run's ledger (the accountant's figures for the noise that was *not* added): it is marked by a file
``NOT_DP.txt`` (with the number of steps whose noise was switched off) and must never be released or compared
as a DP row. The script fails if the trainer never called the switched-off noise (a trainer that bound the noise
function under another name would otherwise train with noise under this label; a resumed run whose every step
an earlier process took fails the same way, as this process cannot vouch for them). The marker is written by the
trainer's save into the staged directory, so it arrives with the trained weights in one atomic rename: there is no
moment at which the finished directory exists unmarked, and bench/direct_regimes.sh takes the marker as "done". An
interrupted run is continued by the same command with ``--resume``. The CLI's closing line says "NOT DP" in place of
the ledger's (epsilon, delta) summary.

Every ledger this script writes (each checkpoint's and the final one) names the mechanism with ``NOISE_OFF`` appended.
The mechanism is part of the plan a resume must share (``privret.train.checkpointing.PLAN_KEYS``) and of what a
finished output must share with a run pointed at it again, so a run with the noise on refuses this script's
checkpoints and outputs (it would otherwise resume one and release its noise-free steps as DP), and this script
refuses a DP run's checkpoint (whose noisy steps it cannot vouch were noise-free).

    OMP_NUM_THREADS=1 .venv/bin/python bench/clip_only.py retriever train --dp public-negatives ... --out DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import privret.train.dp_retriever as dp_retriever
from privret.privacy.ledger import PrivacyLedger

NOISE_OFF = " with the noise switched off (bench/clip_only.py): NOT DP"


def noise_off_ledger(**fields) -> PrivacyLedger:
    """The ledger the trainer describes, its mechanism marked as run without noise."""
    return PrivacyLedger(**{**fields, "mechanism": fields["mechanism"] + NOISE_OFF})


def main() -> None:
    noisy = dp_retriever.set_noisy_mean

    noiseless_steps = 0

    def noiseless(params, summed, *, std, **kw):
        nonlocal noiseless_steps
        noiseless_steps += 1
        return noisy(params, summed, std=0.0, **kw)

    out = Path(sys.argv[sys.argv.index("--out") + 1])
    save = dp_retriever._RetrieverTrainer.save

    def save_marked(self, staged: Path, **kw) -> None:
        if noiseless_steps == 0:  # raised inside the staging: the output directory never appears
            raise SystemExit("clip_only.py: the trainer never called privret.train.dp_retriever.set_noisy_mean, so "
                             f"the noise was not switched off; {out} is not the diagnosis it names")
        save(self, staged, **kw)
        (staged / "NOT_DP.txt").write_text(f"trained with the DP noise switched off in {noiseless_steps} steps of "
                                           "this process (bench/clip_only.py): not DP\n")

    dp_retriever.set_noisy_mean = noiseless
    dp_retriever.PrivacyLedger = noise_off_ledger
    dp_retriever._RetrieverTrainer.save = save_marked
    PrivacyLedger.summary = lambda self: "NOT DP: trained with the noise switched off (bench/clip_only.py)"
    from privret.cli import app

    app(sys.argv[1:], standalone_mode=False)
    if not (out / "NOT_DP.txt").exists():  # a finished directory given again: nothing was trained or saved
        raise SystemExit(f"clip_only.py: {out} has no NOT_DP.txt, so this process did not train the diagnosis it "
                         "names (was it finished by a run with the noise on?)")


if __name__ == "__main__":
    main()
