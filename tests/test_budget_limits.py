"""The single-GPU plan is what it was before tensor parallelism, and a workload that does not fit says which limit it
hits, in words with numbers that follow from the estimate's own figures."""
import pytest

from minivlm.budget import estimate

# The figures of the single-GPU calculator before tensor parallel was added (images_per_request=2, num_seqs=16):
# predicted weights, KV bytes per token, activation peak, KV blocks, requests at once.
BEFORE_TP = {
    ("Qwen2.5-VL-3B-Instruct", "L4"): (7509245952, 36864, 337547264, 22640, 143),
    ("Qwen2.5-VL-3B-Instruct", "H100 80GB"): (7509245952, 36864, 337547264, 116280, 735),
    ("Qwen2.5-VL-7B-Instruct", "L4"): (16584333312, 57344, 570343424, 4409, 27),
    ("Qwen2.5-VL-7B-Instruct", "H100 80GB"): (16584333312, 57344, 570343424, 64607, 408),
    ("Qwen3-VL-2B-Instruct", "L4"): (4255064064, 114688, 218009600, 9115, 70),
    ("Qwen3-VL-4B-Instruct", "H100 80GB"): (8875631616, 147456, 318672896, 28498, 220),
    ("Qwen3-VL-8B-Instruct", "L4"): (17534247392, 147456, 419336192, 1376, 10),
}


@pytest.mark.parametrize("preset, device", sorted(BEFORE_TP))
def test_tensor_parallel_1_leaves_the_single_gpu_plan_unchanged(preset, device):
    for tp in (None, 1):
        e = estimate(preset, device=device, images_per_request=2, num_seqs=16, tensor_parallel_size=tp)
        assert (e.predicted_weights_bytes, e.kv_bytes_per_token, e.activation_peak_bytes, e.num_blocks,
                e.workload_concurrency) == BEFORE_TP[preset, device]
    int4 = estimate("Qwen2.5-VL-7B-Instruct", dtype="int4", device="L4", attn_implementation="eager",
                    max_model_len=2048)
    assert (int4.predicted_weights_bytes, int4.activation_peak_bytes, int4.num_blocks) == \
        (6923847680, 1665692640, 13745)


def test_context_limit_sentence():
    # 1024×768 on Qwen2.5-VL: 27 × 37 = 999 vision tokens, + vision start/end = 1,001 per image
    est = estimate("Qwen2.5-VL-7B-Instruct", device="H100 80GB", images_per_request=4, max_model_len=4096)
    assert not est.fits and not est.fits_context
    assert est.limits == ["4 images × 1,001 tokens (999 vision + start/end) + 512 text tokens = 4,516 tokens per "
                          "request > max_model_len 4,096"]
    text_only = estimate("Qwen2.5-VL-7B-Instruct", device="H100 80GB", images_per_request=0, max_model_len=256)
    assert text_only.limits == ["512 text tokens = 512 tokens per request > max_model_len 256"]


def test_kv_pool_sentence_and_demand_follow_images_and_concurrency():
    est = estimate("Qwen2.5-VL-7B-Instruct", device="L4", images_per_request=2, num_seqs=32)
    per_request = 2 * 1001 + 512  # 2,514 tokens: 158 blocks of 16 = 2,528
    assert est.needed_tokens_per_request == per_request and est.kv_demand_tokens == 32 * 2528
    assert est.kv_pool_tokens == est.num_blocks * 16 < est.kv_demand_tokens and not est.fits
    assert est.limits == [f"the KV pool holds {est.kv_pool_tokens:,} tokens; 32 requests × 2,528 tokens (2,514 "
                          f"rounded up to whole 16-token blocks) need 80,896"]
    # the demand moves with images per request and with concurrency; the pool does not
    more_images = estimate("Qwen2.5-VL-7B-Instruct", device="L4", images_per_request=8, num_seqs=32)
    assert more_images.kv_demand_tokens == 32 * 8528 and more_images.kv_pool_tokens == est.kv_pool_tokens
    assert len(more_images.limits) == 2 and "8,520 tokens per request > max_model_len 4,096" in more_images.limits[0]
    fewer = estimate("Qwen2.5-VL-7B-Instruct", device="L4", images_per_request=2, num_seqs=8)
    assert fewer.fits and fewer.limits == [] and fewer.kv_demand_tokens == 8 * 2528


def test_memory_limit_sentence():
    est = estimate("Qwen2.5-VL-72B-Instruct", device="H100 80GB", tensor_parallel_size=2, max_model_len=32768)
    gib = 2 ** 30
    fixed = est.weights_bytes + est.activation_peak_bytes + est.overhead_bytes
    assert est.num_blocks == 0 and fixed > est.budget_bytes
    assert est.limits == [f"weights {est.weights_bytes / gib:.1f} GiB + activation peak "
                          f"{est.activation_peak_bytes / gib:.1f} GiB + overhead 0.5 GiB = {fixed / gib:.1f} GiB on "
                          f"each of 2 GPUs leave no room for the KV cache in the budget of 71.7 GiB (0.9 × 79.6 GiB)"]
    assert est.limits[0].startswith("weights 68.4 GiB")  # 73.4 B parameters × 2 B / 2 GPUs


def test_fits_exactly_when_no_limit_is_hit():
    for images in (0, 1, 4, 8):
        for seqs in (1, 16, 64, 256):
            for ctx in (2048, 8192):
                est = estimate("Qwen2.5-VL-3B-Instruct", device="L4", images_per_request=images, num_seqs=seqs,
                               max_model_len=ctx)
                assert est.fits == (est.limits == []), (images, seqs, ctx)
