"""Commands and flags that were renamed or moved: for one release an old spelling ends in a one-line error naming
the new one (exit 2), before Click reads the command line.

:data:`COMMANDS` maps an old command path to the new command; :data:`FLAGS` maps (command path, old flag) to what
replaces it, where ``{flag}`` stands for the old flag and ``{value}`` for the value given to it.
"""

from __future__ import annotations

from collections.abc import Sequence

# the top-level options of `privret` that take a value (skipped when finding the command's words)
GLOBAL_OPTIONS_WITH_VALUE = ("--log-file",)

COMMANDS: dict[tuple[str, ...], str] = {
    ("generate",): "privret synth generate",
    ("filter",): "privret synth filter",
}

RETRIEVER_TRAIN_FLAGS = ("temperature", "max_doc_tokens", "seed")  # retriever train (without DP) still takes them
_DP_GENERATOR = "privret generator train-dp {flag} (generator train fine-tunes without DP)"

FLAGS: dict[tuple[tuple[str, ...], str], str] = {
    (("synth", "generate"), "--generator"): "--model",
    (("generator", "train"), "--epsilon"): _DP_GENERATOR,
    (("generator", "train"), "--delta"): _DP_GENERATOR,
    (("generator", "train"), "--clip-norm"): _DP_GENERATOR,
    (("generator", "train"), "--accountant"): _DP_GENERATOR,
    (("generator", "train"), "--secure-rng"): _DP_GENERATOR,
    (("generator", "train"), "--hold-out"): _DP_GENERATOR,
    (("generator", "train"), "--budget-cap"): _DP_GENERATOR,
    (("audit", "canaries"), "--epsilons"): "--epsilon (one target; several in a --config file's epsilons)",
    (("federated", "train"), "--learning-rate"): "--lr",
    (("federated", "train"), "--evaluation-split"): "--eval-split",
    (("federated", "train"), "--dp-epsilon"): "--epsilon",
    (("federated", "train"), "--dp-clip-norm"): "--clip-norm",
    (("federated", "train"), "--dp-noise-multiplier"): "--noise-multiplier",
    (("retriever", "train"), "--dp"): "the command privret retriever train-dp --method {value}",
    (("evaluate",), "--model"): "privret evaluate retrieval --model",
}
# retriever train trains without DP: its DP flags are train-dp's, or fields of train-dp's --config file
FLAGS |= {(("retriever", "train"), flag): "privret retriever train-dp {flag} (retriever train trains without DP)"
          for flag in ("--epsilon", "--delta", "--unit", "--clip-norm", "--trainable", "--public-negatives",
                       "--hard-negatives", "--dropout", "--no-dropout", "--cache-dir", "--resume", "--budget-cap",
                       "--allow-over-budget", "--no-allow-over-budget", "--dataset-name", "--hold-out")}
FLAGS |= {(("retriever", command), "--" + field.replace("_", "-").replace(".", "-")):
          f"the field {field} of a --config FILE of privret retriever train-dp"
          for field in ("lora_rank", "spreadout_weight", "hard_negative_depth", "physical_batch", "checkpoint_every",
                        "max_batch_units", "accountant", "secure_rng", "hold_out.salt", "temperature",
                        "max_doc_tokens", "seed")
          for command in ("train", "train-dp") if command == "train-dp" or field not in RETRIEVER_TRAIN_FLAGS}

# the generator's rarely changed settings: fields of a --config FILE (the canary audit's in its generator section)
FLAGS |= {(("generator", command), "--" + field.replace("_", "-")):
          f"the field {field} of a --config FILE of privret generator {command}"
          for field in ("trainable", "lora_rank", "trained_layers", "max_doc_tokens", "checkpoint_every")
          for command in ("train", "train-dp")}
FLAGS[("generator", "train-dp"), "--hold-out-salt"] = ("the field hold_out.salt of a --config FILE of privret generator "
                                                      "train-dp")
FLAGS |= {(("audit", "canaries"), "--" + field.replace("_", "-")):
          f"the field {section}{field} of a --config FILE of privret audit canaries"
          for section, fields in (("", ("candidates", "top_p", "alpha")),
                                  ("generator.", ("trainable", "lora_rank", "trained_layers", "max_doc_tokens")))
          for field in fields}


def _command_words(argv: Sequence[str]) -> tuple[list[str], int]:
    """The words naming the command (and its positional arguments) up to its first option, and where they end."""
    position = 0
    while position < len(argv) and argv[position].startswith("-"):  # the top-level options
        position += 2 if argv[position] in GLOBAL_OPTIONS_WITH_VALUE else 1
    words = []
    while position < len(argv) and not argv[position].startswith("-"):
        words.append(argv[position])
        position += 1
    return words, position


def _flag_given(argv: Sequence[str], flag: str) -> str | None:
    """The value given to ``flag`` in ``argv`` ('' for a flag without one), or None when it is not given."""
    for position, token in enumerate(argv):
        if token == flag:
            following = argv[position + 1] if position + 1 < len(argv) else ""
            return "" if following.startswith("-") else following
        if token.startswith(flag + "="):
            return token[len(flag) + 1:]
    return None


def moved_spelling(argv: Sequence[str]) -> str | None:
    """The one-line error for an old spelling in the command line ``argv`` (without the program name), or None."""
    words, end = _command_words(argv)
    for depth in range(len(words), 0, -1):
        path = tuple(words[:depth])
        if path in COMMANDS:
            return f"privret {' '.join(path)} is now {COMMANDS[path]}"
    options = argv[end:]
    for (path, flag), replacement in FLAGS.items():
        if tuple(words) != path:  # `evaluate --model` moved, `evaluate retrieval --model` is the new spelling
            continue
        value = _flag_given(options, flag)
        if value is not None:
            return f"privret {' '.join(path)} {flag} is now {replacement.format(flag=flag, value=value)}"
    return None
