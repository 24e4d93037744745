"""The names in a pipeline run directory (see :mod:`privret.pipeline` for the layout), shared by the pipeline
that writes it and the report that reads it.

Plain names only, nothing imported: the report (:mod:`privret.report.collect`) reads a run directory
through them without loading the pipeline and its trainers.
"""

from pathlib import Path

CONFIG_FILE = "config.json"  # the run's config, as last run
SUMMARY_FILE, SUMMARY_MARKDOWN, BUDGET_FILE = "summary.json", "summary.md", "budget.json"
EMBEDDING_CACHE = Path("cache") / "embeddings"  # public encoders only

ZERO_SHOT, ORIGINAL, DOCUMENTS = "zero_shot", "original", "documents"  # rows (and the documents stage)
DP_ROW_PREFIX = "eps-"  # eps-<e>: a DP synthetic row
FILTERED_SUFFIX = "-filtered"  # eps-<e>-filtered: its round-trip-filtered copy
SELECTED_SUFFIX = "-selected"  # eps-<e>-selected: the DP choice among the public encoder and its retrievers
CHOICE = "choice"  # eps-<e>-selected/choice/: the ledger of the choice alone (one release of the run)
DIRECT_ROW_PREFIX = "direct-"  # direct-<method>-eps-<e>: a directly trained DP retriever
# direct-<method>-eps-<e>-selected: the DP choice on the held-out units, when that retriever trained on the fit part
PUBLIC_PROMPTED, PUBLIC_PAIRS = "public-prompted", "public-pairs"  # rows without private data
PUBLIC_ROWS = {PUBLIC_PROMPTED: "no private data (prompted)", PUBLIC_PAIRS: "no private data (public pairs)"}

GENERATOR, SYNTHETIC, RETRIEVER = "generator", "synthetic", "retriever"  # the stage directories of a row
METRICS_FILE, TIMING_FILE = "metrics.json", "timing.json"  # in a row's directory
MAUVE_FILE = "mauve.json"  # in the directory of a row with its own synthetic set: MAUVE against the private queries
