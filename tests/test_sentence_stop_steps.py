"""bench/sentence_stop_steps.py: the decode steps a first-sentence stop leaves a batched sampler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "sentence_stop_steps.py"


def test_a_batch_runs_as_long_as_its_longest_row(tmp_path, tiny_llama_dir):
    queries = tmp_path / "queries.jsonl"
    texts = ["one two. three four",  # first sentence 3 tokens (the tokenizer splits off the full stop) + 1
             "one two three",  # ended by itself (EOS): 3 + 1
             " ".join(["word"] * 12)]  # no sentence end, runs to the cap of 10
    queries.write_text("".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    out = subprocess.run([sys.executable, str(SCRIPT), "--queries", str(queries), "--tokenizer", str(tiny_llama_dir),
                          "--cap", "10", "--batches", "3"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "no sentence end within the cap: 1 (33.3%)" in out.stdout
    assert "mean decode steps of a row that leaves at its stop: 6.0 of 10" in out.stdout
    assert "a batch of 3 rows stops after 10.0 steps" in out.stdout
