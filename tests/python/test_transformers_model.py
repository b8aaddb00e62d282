"""A real model: small randomly initialised Hugging Face transformers models (Llama,
Mistral, Gemma2) with fa3c as their attention, registered through
fa3c.hf.register_transformers(). Nothing is downloaded: models are built from configs.

Logits and gradients follow the project's accuracy rule, with transformers' own
attention (SDPA, or eager for Gemma2's softcap) as the naive computation: fa3c's max
error against the same model in float64 must be at most twice SDPA's in the same
precision, plus 1e-3 of the largest reference value. The CPU tests run in float32;
the GPU test, in bfloat16, skips unless an sm_90 GPU and fa3c's CUDA backend are there.

Skipped as a whole when torch or transformers is missing (CI installs neither).
"""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CI installs numpy only)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(pip install transformers to run the model tests)")

import fa3c  # noqa: E402
import fa3c.hf  # noqa: E402
from fa3c import interface  # noqa: E402

NAME = fa3c.hf.register_transformers()
VOCAB, LAYERS = 256, 2
# initializer_range 0.1 (not Llama's 0.02) so attention scores are of order 1: softmax,
# causal masking, the window and the softcap all change the result.
COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              max_position_embeddings=256, initializer_range=0.1)


def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch (the bf16 model test runs on the GPU machine)"
    if torch.cuda.get_device_capability() != (9, 0):
        return "needs an sm_90 GPU (found sm_%d%d)" % torch.cuda.get_device_capability()
    if not fa3c.cuda_available():
        return "libfa3c at %s has no usable CUDA backend" % fa3c.library_path()
    return None


GPU_SKIP = _gpu_skip_reason()


def build(family, attn, dtype=torch.float32, device="cpu", seed=0, **extra):
    """A model of `family` ("llama", "mistral", "gemma2") with attention `attn`. The same
    seed gives the same weights whatever the attention."""
    cls_cfg, cls_model = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
    }[family]
    torch.manual_seed(seed)
    model = cls_model(cls_cfg(**COMMON, **extra, attn_implementation=attn))
    assert model.config._attn_implementation == attn
    return model.to(device=device, dtype=dtype)


@pytest.fixture
def calls(monkeypatch):
    """Counts fa3c and SDPA attention calls, so that a test cannot pass on SDPA alone."""
    n = {"fa3c": 0, "sdpa": 0}
    fa3c_func = interface.flash_attn_func
    sdpa_func = torch.nn.functional.scaled_dot_product_attention

    def counted_fa3c(*a, **k):
        n["fa3c"] += 1
        return fa3c_func(*a, **k)

    def counted_sdpa(*a, **k):
        n["sdpa"] += 1
        return sdpa_func(*a, **k)

    monkeypatch.setattr(interface, "flash_attn_func", counted_fa3c)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted_sdpa)
    return n


def check(got, naive, want, what):
    """The accuracy rule: max |got - want| <= 2 max |naive - want| + 1e-3 max |want|."""
    got, naive = got.double(), naive.double()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.isfinite(got).all(), "%s: non-finite values" % what
    err = (got - want).abs().max().item()
    nerr = (naive - want).abs().max().item()
    atol = 1e-3 * want.abs().max().item()
    assert err <= 2 * nerr + atol, ("%s: fa3c max error %.3g > 2 x naive %.3g + %.3g"
                                    % (what, err, nerr, atol))


def train_step(model, ids):
    """Forward with labels, backward; returns the logits, loss and gradients by name."""
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def compare_models(family, naive_attn, ids, calls, dtype=torch.float32, device="cpu", **extra):
    """fa3c against `naive_attn` (same dtype) and the float64 model, forward and backward."""
    ours = build(family, NAME, dtype, device, **extra)
    naive = build(family, naive_attn, dtype, device, **extra)
    oracle = build(family, naive_attn, torch.float64, device, **extra)

    logits, loss, grads = train_step(ours, ids)
    # One fa3c call per layer and no SDPA (the backward runs in fa3c's op, uncounted).
    assert calls["fa3c"] == LAYERS and calls["sdpa"] == 0, calls
    n_logits, n_loss, n_grads = train_step(naive, ids)
    w_logits, w_loss, w_grads = train_step(oracle, ids)

    check(logits, n_logits, w_logits, "%s logits" % family)
    check(loss.reshape(1), n_loss.reshape(1), w_loss.reshape(1), "%s loss" % family)
    # Gradients inside attention (q, k, v, o of the first layer: the last the backward
    # reaches) and outside it (the embedding, which all of them flow into).
    names = [n for n in w_grads if "layers.0.self_attn" in n or "embed_tokens" in n]
    assert len(names) >= 5, names
    for n in names:
        check(grads[n], n_grads[n], w_grads[n], "%s grad %s" % (family, n))
    return ours


def test_llama_logits_and_training_step_cpu(calls):
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 48))
    model = compare_models("llama", "sdpa", ids, calls)
    # One optimizer step through fa3c's backward lowers the loss on that batch.
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    _, before, _ = train_step(model, ids)
    opt.step()
    with torch.no_grad():
        after = model(ids, labels=ids).loss
    assert after < before, (before.item(), after.item())


def test_mistral_sliding_window_cpu(calls):
    # 48 tokens over a window of 16: transformers hands over the window's 4-D mask,
    # which fa3c checks against its own pattern and then applies itself.
    torch.manual_seed(2)
    ids = torch.randint(0, VOCAB, (2, 48))
    compare_models("mistral", "sdpa", ids, calls, sliding_window=16)


def test_gemma2_softcap_and_alternating_window_cpu(calls):
    # Gemma2: attention logit softcapping (SDPA has none: eager is the naive model),
    # sliding-window and full layers in turn, a scale of query_pre_attn_scalar ** -0.5
    # (not the default headdim ** -0.5).
    torch.manual_seed(3)
    ids = torch.randint(0, VOCAB, (2, 40))
    compare_models("gemma2", "eager", ids, calls, sliding_window=16, attn_logit_softcapping=5.0,
                   query_pre_attn_scalar=32, final_logit_softcapping=None)


def cache_of(out):
    """The KV cache of a model output, as the keyword argument that passes it on
    (transformers 5 renames past_key_values to cache)."""
    name = "cache" if "cache" in out else "past_key_values"
    return {name: out[name]}


def test_kv_cache_and_generate_cpu(calls):
    ours, ref = build("llama", NAME), build("llama", "sdpa")
    torch.manual_seed(4)
    ids = torch.randint(0, VOCAB, (2, 48))
    with torch.no_grad():
        # A prefill of 40 tokens, then 8 queries against 48 cached keys (a bottom-right
        # causal mask), then one decoding step.
        got, want = [], []
        for model, logits in ((ours, got), (ref, want)):
            out = model(ids[:, :40], use_cache=True)
            logits.append(out.logits)
            out = model(ids[:, 40:], use_cache=True, **cache_of(out))
            logits.append(out.logits)
            out = model(ids[:, :1], use_cache=True, **cache_of(out))
            logits.append(out.logits)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        assert calls["fa3c"] == 3 * LAYERS, calls
        # Greedy generation with an all-ones attention mask, as generate() passes it; with a
        # static cache, whose unfilled tail of keys the mask (or, at the prefill, SDPA's
        # alignment rule) leaves out.
        mask = torch.ones_like(ids[:, :16])
        for cache in (None, "static"):
            a, b = (m.generate(ids[:, :16], attention_mask=mask, max_new_tokens=6, do_sample=False,
                               cache_implementation=cache, return_dict_in_generate=True,
                               output_logits=True, disable_compile=True) for m in (ours, ref))
            assert torch.equal(a.sequences, b.sequences), (cache, a.sequences, b.sequences)
            torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), rtol=1e-4,
                                       atol=1e-4, msg=lambda m: "%s cache: %s" % (cache, m))


def test_masks_checked_never_ignored(calls):
    model = build("llama", NAME)
    ids = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        want = model(ids).logits
        # A causal 4-D mask given by hand, additive (0 / -inf) or boolean, is fa3c's own
        # pattern: accepted.
        additive = torch.full((16, 16), float("-inf")).triu(1).expand(2, 1, 16, 16)
        torch.testing.assert_close(model(ids, attention_mask=additive).logits, want)
        torch.testing.assert_close(model(ids, attention_mask=additive == 0).logits, want)
        assert calls["fa3c"] == 3 * LAYERS, calls
        # Padding (here: left padding in the second sequence) is refused, not ignored.
        pad = torch.ones_like(ids)
        pad[1, :5] = 0
        with pytest.raises(NotImplementedError, match="attention mask"):
            model(ids, attention_mask=pad)
        # So is an additive mask that is a bias rather than a pattern.
        with pytest.raises(NotImplementedError, match="attention mask"):
            model(ids, attention_mask=additive.clone().index_fill_(3, torch.tensor([0]), 0.5))
    assert calls["fa3c"] == 3 * LAYERS, calls


def test_attention_dropout_is_refused():
    model = build("llama", NAME, attention_dropout=0.1).train()
    with pytest.raises(NotImplementedError, match="dropout"):
        model(torch.randint(0, VOCAB, (1, 8)))


@pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))
def test_llama_bf16_cuda(calls):
    torch.manual_seed(5)
    ids = torch.randint(0, VOCAB, (2, 256), device="cuda")
    try:
        compare_models("llama", "sdpa", ids, calls, dtype=torch.bfloat16, device="cuda")
    except fa3c.Fa3cError as e:
        # A build may leave hdim 64's instances out (FA3C_INSTANCES): say so.
        pytest.skip("CUDA backend: %s" % e)
