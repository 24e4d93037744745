"""Dense retrieval, the library below every stage that searches: embedding (and its cache), the FAISS
index, in-memory and streaming search, and the IR metrics of a run."""
