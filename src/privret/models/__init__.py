"""Models: the registry of names, the query generator (causal LM or seq2seq), the dual encoder."""
