"""The frozen-prefix cache gives what the whole encoder gives, gradients included, and skips the frozen layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privret.models.encoder import embed, load_encoder
from privret.errors import InputError
from privret.models.frozen_prefix import FrozenPrefix, disable_frozen_prefix, frozen_prefix
from privret.models.trainable import make_trainable

TEXTS = ["what does aspirin do for the heart", "sleep", "vitamin levels in children and adults",
         "how does the immune response to a virus increase with exercise and diet in patients"]


@pytest.fixture()
def top1(tiny_bert_dir):
    model = load_encoder(str(tiny_bert_dir), max_seq_length=32)
    make_trainable(model, "top:1")  # of 2 layers: the embeddings and layer 1 are frozen
    return model


def test_nothing_to_skip_when_every_layer_trains(tiny_bert_dir):
    for spec in ("all", "layers", "lora"):
        model = load_encoder(str(tiny_bert_dir), max_seq_length=32)
        make_trainable(model, spec)
        assert frozen_prefix(model) is None


def test_the_cache_can_be_switched_off_for_one_model(top1, tiny_bert_dir):
    other = load_encoder(str(tiny_bert_dir), max_seq_length=32)
    make_trainable(other, "top:1")
    disable_frozen_prefix(top1)
    assert frozen_prefix(top1) is None and frozen_prefix(other) is not None


def test_embeddings_and_gradients_equal_the_full_forward(top1):
    top1.eval()  # no dropout: the two paths compute the same function
    prefix = frozen_prefix(top1)
    assert prefix is not None and prefix.n_frozen == 1
    for max_length in (None, 4):
        full = embed(top1, TEXTS, max_length=max_length)
        cached = prefix.embed(TEXTS, max_length=max_length)
        torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-4)
    trainable = [p for p in top1.parameters() if p.requires_grad]
    grads = []
    for fn in (lambda: embed(top1, TEXTS), lambda: prefix.embed(TEXTS)):
        out = fn()
        loss = (out[:, :5] ** 2).sum() + out[0] @ out[1]
        grads.append(torch.autograd.grad(loss, trainable))
    for g_full, g_cached in zip(*grads):
        torch.testing.assert_close(g_cached, g_full, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(prefix.encode(TEXTS), embed(top1, TEXTS).detach().numpy(), atol=1e-5)


def test_the_frozen_layers_run_once_per_text(top1):
    prefix = frozen_prefix(top1)
    layers = top1[0].auto_model.encoder.layer
    frozen_layer = layers[0]
    calls = []
    frozen_layer.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    prefix.embed(TEXTS[:2])
    prefix.embed(TEXTS)  # two new texts: the frozen layer sees only those
    prefix.embed(TEXTS)
    assert calls == [2, 2]
    assert top1[0].auto_model.encoder.layer is layers  # the model's own layer list is back
    assert frozen_prefix(top1) is prefix  # kept on the model


def test_a_changed_trainable_set_is_never_served_from_a_stale_cache(top1):
    """The cache kept for ``top:1`` must not be used once the lower layer trains too (its kept output would
    hide that layer from the gradient), and a new one is made when the layer is frozen again."""
    kept = frozen_prefix(top1)
    assert kept is not None and kept.n_frozen == 1
    make_trainable(top1, "all")
    assert frozen_prefix(top1) is None
    make_trainable(top1, "bias-top:1")
    again = frozen_prefix(top1)
    assert again is not None and again is not kept and again.n_frozen == 1


def test_filling_the_cache_leaves_every_module_in_the_mode_it_had(top1):
    """A loader leaves the BERT inside in eval mode under a SentenceTransformer in training mode; filling the
    cache must not switch the inner dropout on (``model.train(True)`` would)."""
    top1.train()
    top1[0].auto_model.eval()
    modes = [m.training for m in top1.modules()]
    frozen_prefix(top1).embed(["a query about the immune response"], max_length=16)
    assert [m.training for m in top1.modules()] == modes


def test_the_kept_states_stay_within_their_bound_and_dropped_ones_are_computed_again(top1):
    """With room for about two texts the cache drops the least recently used; what it serves is unchanged, and a
    dropped text runs the frozen layer again."""
    top1.eval()
    unbounded = FrozenPrefix(top1, limit_bytes=2**40)
    reference = unbounded.embed(TEXTS, max_length=16).detach()
    per_text = max(h.nbytes for h in unbounded._states.values())
    bounded = FrozenPrefix(top1, limit_bytes=2 * per_text)
    calls = []
    top1[0].auto_model.encoder.layer[0].register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    torch.testing.assert_close(bounded.embed(TEXTS, max_length=16), reference)  # a batch larger than the bound
    assert bounded.kept_bytes == sum(h.nbytes for h in bounded._states.values()) <= 2 * per_text
    assert len(bounded._states) < len(TEXTS)
    for text in TEXTS:
        torch.testing.assert_close(bounded.embed([text], max_length=16)[0], reference[TEXTS.index(text)])
        assert bounded.kept_bytes <= 2 * per_text
    assert calls[0] == len(TEXTS) and sum(calls) > len(TEXTS)  # dropped texts ran the frozen layer again
    calls.clear()
    bounded.embed([TEXTS[-1]], max_length=16)  # the most recent is kept
    assert calls == []


@pytest.mark.parametrize("raw", ["0", "-1", "many"])
def test_a_bad_cache_bound_is_refused_with_its_variable(monkeypatch, top1, raw):
    monkeypatch.setenv("PRIVRET_FROZEN_PREFIX_GIB", raw)
    with pytest.raises(InputError, match="PRIVRET_FROZEN_PREFIX_GIB"):
        FrozenPrefix(top1)
