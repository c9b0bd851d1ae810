"""Self-graded exercises: each check runs your code on fresh inputs and says what is wrong.

    from mha_lib.checks import check_causal_mask
    check_causal_mask(my_causal_mask)   # shows ✅ / ⏳ / ❌ with a hint

Every check returns a :class:`CheckResult` whose ``bool()`` is True only when your code
passed, and never raises because of your code: a stub reads "not implemented yet", an
exception is reported in a line with a hint (your line, and mha_lib's message when mha_lib
refused what you passed), and a wrong answer is compared against the common mistakes so
the hint can name yours. Checks run on the CPU, on copies of their inputs, and leave the
global random state as it was.

In Jupyter each call shows its verdict where it stands in the cell (once, also when it is
the cell's value); ``assert check_x(f)`` raises :class:`CheckFailed` with the verdict; with
``MHA_CHECK_RAISE=1`` a failed check raises (how CI fails on it). See ``_result.py``.

The modules: ``_result`` (results, display), ``_calling`` (calling your code), ``_core``
(validation, diagnosis), ``reference`` (the one reference implementation), then one
module per topic, in the order of the chapters: ``attention`` and ``masks`` (01, 04),
``one_head`` (02), ``heads`` and ``modules`` (03, 04), ``pytorch`` and ``comparing`` (05), ``positions`` and
``alibi`` (06; ALiBi's known mistakes in ``_alibi_mistakes``), ``encoder``, ``ablated_logits``,
``logit_terms`` and ``recount`` (07; their models in ``_sentiment``), ``repeated_segments``,
``head_scores``, ``ablation_losses``, ``head_parts`` and ``copying`` (08; the last two share
``_circuits``), ``language_model`` (09), ``efficient`` (10), ``inference``, ``kv_cache`` and
``latent`` (11), ``restrict`` (12).
"""

from ._result import CHECK_RAISE, CheckFailed, CheckResult
from ._core import CHECK_SEED, hidden_cases
from .attention import (
    check_attention_scores,
    check_masked_attention,
    check_scaled_dot_product_attention,
    check_unit_variance_scale,
)
from .heads import check_combine_heads, check_parameter_count, check_positions_read, check_split_heads
from .masks import check_causal_mask, check_causal_padding_mask, check_left_padded_causal_mask, check_padding_mask
from .modules import check_cross_attention, check_multi_head_attention
from .one_head import check_attention_head, check_self_attention, check_sharpness_needed
from .pytorch import check_attn_mask_for_torch, check_copy_to_torch, check_key_padding_mask_for_torch
from .comparing import check_tolerances_and_gradients
from .positions import check_apply_rotary, check_rotary_attention
from .alibi import check_alibi_bias
from .encoder import check_encoder_layer, check_head_ablation
from .ablated_logits import check_ablated_logits
from .logit_terms import check_logit_attribution
from .recount import check_recount
from .repeated_segments import check_repeated_segment_batch
from .head_scores import check_induction_score, check_previous_token_score
from .ablation_losses import check_ablation_losses
from .head_parts import check_head_parts
from .copying import check_copying_score, check_ov_circuit
from .language_model import check_class_ablation, check_role_baseline, check_role_score
from .efficient import check_blockwise_attention, check_fused_projection
from .inference import check_repeat_kv, check_sliding_window_mask
from .kv_cache import check_cached_attention
from .latent import check_absorb_up_projections
from .restrict import check_halves_mask, check_restricted_attention

__all__ = [
    "CHECK_RAISE",
    "CHECK_SEED",
    "hidden_cases",
    "CheckFailed",
    "CheckResult",
    "check_ablated_logits",
    "check_ablation_losses",
    "check_absorb_up_projections",
    "check_alibi_bias",
    "check_apply_rotary",
    "check_cached_attention",
    "check_recount",
    "check_repeat_kv",
    "check_rotary_attention",
    "check_sliding_window_mask",
    "check_attention_head",
    "check_attention_scores",
    "check_attn_mask_for_torch",
    "check_blockwise_attention",
    "check_causal_mask",
    "check_causal_padding_mask",
    "check_class_ablation",
    "check_combine_heads",
    "check_copy_to_torch",
    "check_copying_score",
    "check_cross_attention",
    "check_encoder_layer",
    "check_fused_projection",
    "check_halves_mask",
    "check_head_parts",
    "check_head_ablation",
    "check_induction_score",
    "check_key_padding_mask_for_torch",
    "check_left_padded_causal_mask",
    "check_logit_attribution",
    "check_masked_attention",
    "check_multi_head_attention",
    "check_ov_circuit",
    "check_padding_mask",
    "check_parameter_count",
    "check_positions_read",
    "check_previous_token_score",
    "check_repeated_segment_batch",
    "check_restricted_attention",
    "check_role_baseline",
    "check_role_score",
    "check_scaled_dot_product_attention",
    "check_self_attention",
    "check_sharpness_needed",
    "check_split_heads",
    "check_tolerances_and_gradients",
    "check_unit_variance_scale",
]
