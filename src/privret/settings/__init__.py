"""Every setting privret reads, as pydantic models, in one torch-free place.

``training`` (retriever and generator training, the DP choice), ``synthesis`` (generation, filtering, the document
choice), ``partition_selection`` (the DP document selection), ``federated`` (PDD-AS2), ``pipeline`` (a config file:
the grid of stages) and ``fields`` (the shared field types). A command's ``--config FILE`` and a pipeline config are
read by these models, so one field has one name, one default and one check everywhere.
"""
