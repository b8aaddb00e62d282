"""fa3c as the attention of Hugging Face transformers models.

    import fa3c.hf
    fa3c.hf.register_transformers()          # registers the name "fa3c"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fa3c")

transformers calls the registered function from each attention layer with
q, k, v of shape (batch, heads, seqlen, headdim), k and v with the model's own
number of KV heads; it runs fa3c.flash_attn_func on (batch, seqlen, heads,
headdim) views of them (no copy), so CPU tensors take fa3c's CPU backend, CUDA
tensors its CUDA backend, and autograd works through fa3c's backward.

What the layer asks for is mapped onto fa3c's arguments: `scaling` is the
softmax scale, `is_causal` (else the module's is_causal) is `causal`, a
`sliding_window` of W (keys less than W positions back) is window_size
(W - 1, W - 1), `softcap` is softcap; GQA needs nothing (fa3c takes fewer KV
heads); `s_aux` (gpt-oss's attention sinks, one logit per head) is fa3c's sinks
(CPU, and CUDA in bf16/fp16). As in transformers' own FlashAttention path, the window comes from the
call's sliding_window argument only: some models keep a module.sliding_window
on layers that do not use it.

Masks. fa3c applies causal and window masks itself; it cannot apply an
arbitrary mask. The mask transformers builds for this name is the one it builds
for SDPA: None where the pattern is plain causal (or full, for encoders), which
is the common case, and a boolean (batch, 1, q, k) tensor otherwise. Such a
tensor is used only after checking that it is exactly fa3c's causal / window
pattern (a sliding window that bites, queries after a KV cache), possibly
followed by keys no query sees (a static cache's unfilled tail, then left out);
anything else (padding, packed sequences, a custom mask) raises
NotImplementedError: a mask is never ignored. The check reads the mask (device
syncs on CUDA), once per layer.
"""
import torch

from . import interface

# Arguments some models pass that fa3c has no equivalent for.
_UNSUPPORTED = ("position_bias", "cu_seq_lens_q", "cu_seq_lens_k")


def _pattern(sq, sk, causal, window, device):
    """fa3c's mask as a (sq, sk) boolean: queries bottom-right aligned with the keys."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i + (sk - sq)
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def _keys_in_pattern(mask, sq, sk, causal, window):
    """How many leading keys the 4-D mask gives exactly fa3c's pattern over, for every
    batch and head, with the keys after them masked out entirely (the unfilled tail of a
    static cache); None when it is no such mask."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4 or tuple(mask.shape[-2:]) != (sq, sk):
        return None     # e.g. flex attention's BlockMask
    if mask.dtype != torch.bool:
        # An additive mask: 0 where allowed, -inf or the dtype's lowest where not; any
        # other value is a bias fa3c cannot add.
        allowed = mask == 0
        blocked = mask <= torch.finfo(mask.dtype).min / 2
        if not bool((allowed | blocked).all()):
            return None
        mask = allowed
    seen = mask.flatten(0, 2).any(0).nonzero()
    if seen.numel() == 0:
        return None
    n = int(seen[-1]) + 1
    if not bool((mask[..., :n] == _pattern(sq, n, causal, window, mask.device)).all()):
        return None
    return n


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, sliding_window=None, softcap=None, **kwargs):
    """The function registered with transformers' AttentionInterface. Returns
    (output (batch, seqlen, heads, headdim), None): no attention weights."""
    if dropout:
        raise NotImplementedError("fa3c: attention dropout (%g) is not supported; set the "
                                  "model's attention_dropout to 0" % dropout)
    for name in _UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise NotImplementedError("fa3c: transformers passed %s, which fa3c attention "
                                      "does not support" % name)
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    window = (-1, -1) if not sliding_window else (sliding_window - 1, sliding_window - 1)
    sq = query.shape[2]

    if attention_mask is None:
        # None means the plain pattern, with SDPA's alignment: when a causal prefill meets
        # more keys than queries (the empty tail of a static cache), the queries are the
        # first keys' positions, so the tail is dropped.
        if is_causal and sq > 1 and key.shape[2] > sq:
            key, value = key[:, :, :sq], value[:, :, :sq]
    else:
        n = _keys_in_pattern(attention_mask, sq, key.shape[2], is_causal, window)
        if n is None:
            raise NotImplementedError(
                "fa3c: the attention mask is not a plain %s%s pattern (padding, packed sequences "
                "or a custom mask, shape %s); fa3c cannot apply it. Run unpadded batches (all "
                "sequences the same length), or another attn_implementation for this model"
                % ("causal" if is_causal else "full", " sliding-window" if sliding_window else "",
                   tuple(attention_mask.shape)))
        key, value = key[:, :, :n], value[:, :, :n]

    out = interface.flash_attn_func(query.transpose(1, 2), key.transpose(1, 2),
                                    value.transpose(1, 2), softmax_scale=scaling,
                                    causal=bool(is_causal), window_size=window,
                                    softcap=float(softcap or 0.0), s_aux=kwargs.get("s_aux"))
    return out, None


def register_transformers(name="fa3c"):
    """Register fa3c with transformers under `name`, for attn_implementation=name (in
    from_config / from_pretrained, or model.set_attn_implementation). Returns name.

    The mask function registered alongside is SDPA's: without one, transformers builds
    no mask at all for a custom name, and padding would go unseen."""
    from transformers import AttentionInterface
    AttentionInterface.register(name, attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        # Older transformers (no masking_utils) build the masks in each model; whatever
        # reaches attention_forward is checked all the same.
        pass
    else:
        AttentionMaskInterface.register(name, sdpa_mask)
    return name
