"""Which parameters of a SentenceTransformer encoder the direct-DP trainer updates.

Trainable parameters (``trainable``): ``all`` (every encoder parameter except the position embeddings,
which broadcast over the batch and cannot be clipped per sample, and the unused pooler), ``layers``
(every transformer layer, the embeddings frozen: in MiniLM-L6 the word embeddings are half of the
weights), ``top:K`` (the top K transformer layers; lower layers are frozen and their backward is
skipped), ``lora`` (LoRA
adapters of rank ``lora_rank`` on the attention query/key/value projections, merged before saving),
``bias`` (BitFit, Ben Zaken, Goldberg and Ravfogel 2022: every bias and LayerNorm parameter of the
embeddings and layers, about 0.1% of MiniLM-L6's weights; the fewer the parameters, the smaller the
DP noise's norm at a given noise multiplier), ``bias-top:K`` (BitFit on the top K layers only: the
embeddings and lower layers frozen, so their output can be kept per text,
:mod:`privret.models.frozen_prefix`, and the noise's norm shrinks with the square root of the count).
"""

from __future__ import annotations

import torch

from privret.errors import InputError


def make_trainable(model, spec: str, *, lora_rank: int = 8) -> dict[str, torch.nn.Parameter]:
    """Freeze all but the chosen parameters of a SentenceTransformer (see module docstring)."""
    auto = model[0].auto_model
    for p in model.parameters():
        p.requires_grad_(False)
    if spec == "lora":
        from peft import LoraConfig, get_peft_model

        targets = [n for n in ("query", "key", "value") if any(name.endswith("." + n) for name, _ in
                                                                 auto.named_modules())] or ["q_proj", "v_proj"]
        peft_model = get_peft_model(auto, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0,
                                                     target_modules=targets))
        _replace_auto_model(model[0], peft_model)
        return {n: p for n, p in model.named_parameters() if "lora_" in n}
    layers = _layer_list(auto)
    if spec == "all":
        chosen = [p for n, p in auto.named_parameters() if "pooler" not in n and "position_embeddings" not in n]
    elif spec == "bias":
        chosen = _biases(auto)
    elif spec == "layers":
        chosen = list(layers.parameters())
    else:
        k = int(spec.split(":")[1])
        if k > len(layers):
            raise InputError(f"the encoder has {len(layers)} layers, cannot train the top {k}", field="trainable")
        bitfit = spec.startswith("bias-")
        chosen = [p for layer in layers[-k:] for p in (_biases(layer) if bitfit else layer.parameters())]
    for p in chosen:
        p.requires_grad_(True)
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _biases(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Every bias and LayerNorm parameter of ``module`` (BitFit), the pooler's left out."""
    norms = {id(p) for m in module.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    return [p for n, p in module.named_parameters() if "pooler" not in n and (n.endswith(".bias") or id(p) in norms)]


def _layer_list(auto) -> torch.nn.ModuleList:
    for name, module in auto.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] in ("layer", "layers"):
            return module
    raise InputError("cannot find the transformer layers of this encoder", field="trainable")


def _replace_auto_model(transformer, new) -> None:
    """Put ``new`` where ``transformer`` (a sentence-transformers Transformer module) keeps its HF model.

    sentence-transformers >= 5 keeps it in ``model`` and ``auto_model`` is a read-only alias: assigning
    to the alias would only register a second, unused submodule (and the saved file would miss the
    adapters' merge)."""
    if isinstance(getattr(type(transformer), "auto_model", None), property):
        transformer.model = new
    else:
        transformer.auto_model = new


def merge_adapters(model) -> None:
    """Merge LoRA adapters so the saved model is a plain SentenceTransformer."""
    auto = model[0].auto_model
    if hasattr(auto, "merge_and_unload"):
        _replace_auto_model(model[0], auto.merge_and_unload())
