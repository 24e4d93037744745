"""Diagnosis, NOT a DP release: run ``privret retriever train --dp ...`` with the noise switched off.

Everything a DP run does (Poisson sampling, per-unit clipping, the division by the expected batch, the optimizer)
happens, but the Gaussian noise has standard deviation 0, so the output shows what clipping and the step schedule
alone do to the objective; the difference to the DP run is what the noise costs. The output directory still gets
the DP run's ledger (the accountant's figures for the noise that was *not* added): it is marked by a file
``NOT_DP.txt`` (with the number of steps whose noise was switched off) and must never be released or compared
as a DP row. The script fails if the trainer never called the switched-off noise (a trainer that bound the noise
function under another name would otherwise train with noise under this label; a resumed run with no step left
fails the same way). The marker is written when training has finished (bench/direct_regimes.sh takes it as
"done"); an interrupted run is continued by the same command with ``--resume`` (a marker in an unfinished
directory would make privret refuse to resume it). The CLI's closing line says "NOT DP" in place of the ledger's
(epsilon, delta) summary.

    OMP_NUM_THREADS=1 .venv/bin/python bench/clip_only.py retriever train --dp public-negatives ... --out DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import privret.train.dp_retriever as dp_retriever
from privret.privacy.ledger import PrivacyLedger


def main() -> None:
    noisy = dp_retriever.set_noisy_mean

    noiseless_steps = 0

    def noiseless(params, summed, *, std, **kw):
        nonlocal noiseless_steps
        noiseless_steps += 1
        return noisy(params, summed, std=0.0, **kw)

    dp_retriever.set_noisy_mean = noiseless
    PrivacyLedger.summary = lambda self: "NOT DP: trained with the noise switched off (bench/clip_only.py)"
    from privret.cli import app

    out = Path(sys.argv[sys.argv.index("--out") + 1])
    app(sys.argv[1:], standalone_mode=False)
    if noiseless_steps == 0:
        raise SystemExit("clip_only.py: the trainer never called privret.train.dp_retriever.set_noisy_mean, so the "
                         f"noise was not switched off; {out} is not the diagnosis it names")
    (out / "NOT_DP.txt").write_text(f"trained with the DP noise switched off in {noiseless_steps} steps of this "
                                    "process (bench/clip_only.py): not DP\n")


if __name__ == "__main__":
    main()
