"""Training loops: the DP generator fine-tune and the dual-encoder retriever."""
