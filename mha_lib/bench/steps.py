"""What the benchmark runs: the four variants with the same weights, and one step of each."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..efficient import EfficientMultiHeadAttention
from ..multi_head import MultiHeadAttention
from ..positions import alibi_bias
from ..validation import check_heads, check_positive_int

__all__ = ["BASELINE", "DTYPES", "EXPLICIT", "KERNELS", "MASKS", "MODES", "VARIANTS", "Step", "make_mask",
           "make_step", "make_variants"]

VARIANTS = ("teaching", "efficient", "nn.MHA(weights)", "nn.MHA")
BASELINE = "nn.MHA"  # need_weights=False
MODES = ("forward", "fwd+bwd")
EXPLICIT = ("teaching", "nn.MHA(weights)")  # the variants that always store (B, H, L, L) weights
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
MASKS = {
    "none": "no mask",
    "causal": "a causal (L, L) bool mask",
    "per-head": "a causal (H, L, L) bool mask, one per head (the shape of the last chapter, restricting heads)",
    "float-grad": "a causal (L, L) float mask of 0 and -inf that requires grad (a learned bias)",
    "halves": "an (H, L, L) bool mask: even heads see the first half of the keys, odd heads the second "
              "(chapter 12's challenge)",
    "alibi": "ALiBi's (H, L, L) float bias, causal (chapter 06)",
}
KERNELS = {  # which kernels F.scaled_dot_product_attention may choose from (torch.nn.attention.sdpa_kernel)
    "auto": "any (PyTorch picks)",
    "math": "the explicit math kernel only, which stores the weights",
}

Variant = Callable[..., Tensor]  # (x (B, L, D), mask=None) -> output (B, L, D)


def make_mask(kind: str, length: int, num_heads: int, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> Tensor | None:
    """The mask ``kind`` (a key of ``MASKS``) for ``length`` tokens, in mha_lib's convention."""
    if not isinstance(kind, str) or kind not in MASKS:
        raise ValueError(f"mask must be one of {list(MASKS)}, got {kind!r}")
    length, num_heads = check_positive_int(length, "length"), check_positive_int(num_heads, "num_heads")
    if kind == "none":
        return None
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()  # (L, L)
    if kind == "per-head":
        return causal.repeat(num_heads, 1, 1)  # (H, L, L)
    if kind == "halves":
        first = torch.arange(length, device=device) < length // 2  # (L,): the keys of the first half
        per_head = torch.stack([first if h % 2 == 0 else ~first for h in range(num_heads)])  # (H, L)
        return per_head[:, None, :].expand(num_heads, length, length).contiguous()  # (H, L, L)
    if kind == "alibi":
        return alibi_bias(num_heads, length, device=device).to(dtype).masked_fill(~causal, float("-inf"))  # (H, L, L)
    if kind == "float-grad":
        bias = torch.zeros(length, length, dtype=dtype, device=device).masked_fill(~causal, float("-inf"))
        return bias.requires_grad_()  # (L, L)
    return causal


def _torch_mask(mask: Tensor | None, batch: int) -> Tensor | None:
    """mha_lib's mask in ``nn.MultiheadAttention``'s convention: bool True = *blocked*, (B·H, L, L) per head."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = ~mask
    return mask.repeat(batch, 1, 1) if mask.dim() == 3 else mask


def make_variants(
    d_model: int, num_heads: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
    seed: int = 0, dropout: float = 0.0,
) -> dict[str, Variant]:
    """The four implementations with the same weights, as ``(x (B, L, D), mask=None) -> output (B, L, D)``.

    ``mask`` follows mha_lib's convention (bool True = may attend, or a float added to the scores).
    Each callable has a ``.module`` attribute (for ``train()``/``eval()`` and its parameters).
    """
    torch.manual_seed(seed)
    teaching = MultiHeadAttention(d_model, num_heads, dropout=dropout)
    efficient = EfficientMultiHeadAttention.from_module(teaching)
    torch_mha = nn.MultiheadAttention(d_model, num_heads, dropout=dropout, batch_first=True)
    with torch.no_grad():  # nn.MultiheadAttention's in_proj_weight is laid out like W_qkv
        torch_mha.in_proj_weight.copy_(efficient.W_qkv.weight)
        torch_mha.in_proj_bias.copy_(efficient.W_qkv.bias)
        torch_mha.out_proj.weight.copy_(efficient.W_o.weight)
        torch_mha.out_proj.bias.copy_(efficient.W_o.bias)
    for module in (teaching, efficient, torch_mha):
        module.to(device, dtype)

    def named(fn: Variant, module: nn.Module) -> Variant:
        fn.module = module  # type: ignore[attr-defined]
        return fn

    def torch_call(x: Tensor, mask: Tensor | None, need_weights: bool) -> Tensor:
        return torch_mha(x, x, x, attn_mask=_torch_mask(mask, x.size(0)), need_weights=need_weights)[0]

    return {
        "teaching": named(lambda x, mask=None: teaching(x, x, x, mask), teaching),
        "efficient": named(lambda x, mask=None: efficient(x, x, x, mask), efficient),
        "nn.MHA(weights)": named(lambda x, mask=None: torch_call(x, mask, True), torch_mha),
        "nn.MHA": named(lambda x, mask=None: torch_call(x, mask, False), torch_mha),
    }


def make_step(fn: Variant, x: Tensor, mode: str, mask: Tensor | None = None) -> Callable[[], None]:
    """One inference forward (``"forward"``) or one training step (``"fwd+bwd"``) of ``fn`` on ``x``.

    The training step sends a fixed dense gradient back (as a loss would) and drops the
    parameters' gradients at its end, so that every step starts from the same memory.
    """
    module: nn.Module = fn.module  # type: ignore[attr-defined]
    if mode == "forward":

        def forward() -> None:
            module.eval()
            with torch.no_grad():
                fn(x, mask)

        return forward
    if mode == "fwd+bwd":
        upstream = torch.randn_like(x)  # a dense gradient, as a loss would send back

        def train_step() -> None:
            module.train()
            fn(x, mask).backward(upstream)
            for p in module.parameters():
                p.grad = None
            if mask is not None:
                mask.grad = None

        return train_step
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


@functools.lru_cache(maxsize=1)
def _shared_variants(*args: object) -> dict[str, Variant]:
    """make_variants(*args), built once for a run of steps with the same settings."""
    return make_variants(*args)  # type: ignore[arg-type]


class Step:
    """One step of one variant, as a picklable object: it builds its module and input on first call.

    ``peak_memory`` runs CPU steps in another process, which needs a step it can send there;
    a ``Step`` sends only its settings. Example::

        step = Step("teaching", "forward", length=1024, d_model=128, num_heads=8)
        step()  # builds the modules and a (batch, length, d_model) input, then runs

    ``kernel="math"`` runs the step with the math kernel only (:data:`KERNELS`), the kernel the
    CPU chooses where no fused one takes the inputs: "before" of a change that lets a fused one.
    """

    def __init__(self, variant: str, mode: str, length: int, batch: int = 1, d_model: int = 512,
                 num_heads: int = 8, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 mask: str = "none", dropout: float = 0.0, seed: int = 0, kernel: str = "auto") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose from {list(VARIANTS)}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mask not in MASKS:
            raise ValueError(f"mask must be one of {list(MASKS)}, got {mask!r}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")
        length, batch = check_positive_int(length, "length"), check_positive_int(batch, "batch")
        d_model, num_heads, dropout = check_heads(d_model, num_heads, dropout)
        self.settings = dict(variant=variant, mode=mode, length=length, batch=batch, d_model=d_model,
                             num_heads=num_heads, dtype=dtype, device=torch.device(device), mask=mask,
                             dropout=dropout, seed=seed, kernel=kernel)
        self._run: Callable[[], None] | None = None

    def _build(self) -> Callable[[], None]:
        s = self.settings
        fn = _shared_variants(s["d_model"], s["num_heads"], s["device"], s["dtype"], s["seed"], s["dropout"])[s["variant"]]
        x = torch.randn(s["batch"], s["length"], s["d_model"]).to(s["device"], s["dtype"])
        mask = make_mask(s["mask"], s["length"], s["num_heads"], s["device"], s["dtype"])
        return make_step(fn, x, s["mode"], mask)

    def __call__(self) -> None:
        if self._run is None:
            self._run = self._build()
        if self.settings["kernel"] == "math":  # what PyTorch falls back to when no fused kernel takes the inputs
            with sdpa_kernel(SDPBackend.MATH):
                self._run()
        else:
            self._run()

    def __getstate__(self) -> dict:
        return {"settings": self.settings, "_run": None}

    def __repr__(self) -> str:
        return "Step(" + ", ".join(f"{k}={v!r}" for k, v in self.settings.items()) + ")"
