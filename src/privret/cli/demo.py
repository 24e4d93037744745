"""The configuration of ``privret demo``: the pipeline on the bundled demo dataset (:mod:`privret.data.demo`)."""

from __future__ import annotations

from privret.settings.pipeline import (BudgetSettings, DirectDPGrid, GeneratorStage, PipelineConfig, PublicExample,
                                       PublicRows)
from privret.data.demo import demo_dataset_dir
from privret.settings.synthesis import GenerateConfig
from privret.settings.training import DPRetrieverSettings, RetrieverTrainConfig, SelectionSettings

# Public (document, query) pairs written for the demo, about help-desk systems the demo log never names: the
# prompted epsilon-0 row shows them, and the DP generator starts from that prompt (privret.train.public_start).
DEMO_PUBLIC_EXAMPLES = (
    ("Booking a meeting room in Room Finder. Open Room Finder from the intranet home page, pick a building and a "
     "time, and press Reserve; rooms for more than twelve people need approval from Facilities.",
     "how do i book a room for 20 people"),
    ("Printer shows offline on your laptop. Reconnect to the office network, then remove the printer under "
     "Settings and add it again from the print server list; if it still says offline, raise a ticket.",
     "printer says offline"),
    ("Claiming overtime in the Timesheet app. Enter overtime on the day it was worked and add a note; your "
     "manager approves it before the payroll cut-off on the 20th of each month.", "when does overtime get approved"),
)
DEMO_LOG_UNITS = 170  # distinct training queries of the bundled demo log (tests/test_demo_dataset.py checks it)


def demo_config() -> PipelineConfig:
    """Small enough for about 15 minutes on 2 CPU cores: one epsilon plus the references.

    The prompted epsilon-0 row shows :data:`DEMO_PUBLIC_EXAMPLES`; the DP generator starts from it. Two DP rows at
    epsilon 8, alternatives (releasing both composes their budgets: at most 16, see budget.json):

    - the synthetic route, 7 on the generator and 1 on a DP choice, on the private log, among the public
      encoder, the retriever trained on the synthetic queries and their interpolation (``private_selection``),
      which shows what the synthetic queries are worth on real queries;
    - direct DP training of the encoder with DPRetrieverSettings' defaults, the measured regime (public-negatives,
      BitFit of the top 3 layers, 2 hard and 1 random public negative, no dropout, C = 1), every unit in every
      step, at 12 steps and lr 4e-3, a schedule fixed by its running time before any score on test.

    The demo data is public (written by the privret authors), and re-running the demo in another
    directory trains on it again: it allows going over the budget cap."""
    return PipelineConfig(
        name="demo", dataset=demo_dataset_dir(), epsilons=[7.0], synthetic_documents="corpus",
        private_selection=SelectionSettings(epsilon=1.0),
        public_rows=PublicRows(prompted=True, public_examples=[PublicExample(doc=doc, query=query)
                                                               for doc, query in DEMO_PUBLIC_EXAMPLES]),
        generator=GeneratorStage(batch_size=32, epochs=4, trained_layers=8, max_doc_tokens=96, learning_rate=2e-3,
                                 checkpoint_every=5),
        generate=GenerateConfig(num_queries=2, batch_size=32, max_new_tokens=32),
        # fixed with sight of the demo's test split: an illustration's setting, not a benchmark's (docs/results.md,
        # "The demo"); the research configs choose theirs on a validation split (selection)
        retriever=RetrieverTrainConfig(epochs=4, batch_size=32, learning_rate=1e-4),
        direct_dp=DirectDPGrid(methods=["public-negatives"], epsilons=[8.0], settings=DPRetrieverSettings(
            batch_size=DEMO_LOG_UNITS, epochs=12, learning_rate=4e-3)),
        budget=BudgetSettings(allow_over=True))
