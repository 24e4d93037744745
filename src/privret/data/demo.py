"""The bundled demo dataset (written by the privret authors, shipped in the package); its pipeline
config is :func:`privret.cli.demo.demo_config`.

The dataset is an organisation's internal help-desk log: staff call the internal systems by
nicknames and codes that the knowledge-base articles never use, so the public encoder cannot tell
which system a query means, while a retriever trained on the log learns it from the training
queries (written by ``tools/make_demo_dataset.py``; see its docstring).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def demo_dataset_dir() -> Path:
    return Path(str(files("privret.data") / "demo_dataset"))
