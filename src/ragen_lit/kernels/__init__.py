"""GPU kernels and attention paths below the model code: each beside the library path it beats, and tested against
that path on a CPU (Triton's interpreter, or PyTorch's CPU kernels).

- `logprob`: log_softmax at one target per row in two Triton kernels that read the logits once (the library path:
  the compiled log-softmax and gather of `logprobs`);
- `gumbel`: a draw from softmax(logits / T) by the Gumbel-max trick, its uniforms made in registers by Philox (the
  library path: `torch.rand` into a tensor, then a compiled Gumbel-max);
- `split_decode`: one-token decode attention split along the cache, masked blocks skipped (flash-decoding; the
  library path: sdpa's kernels);
- `row_attention`: the cross-scorer's packed rows over their prompt's prefix and their own tokens in one pass (the
  library path: `varlen_attention`, FlashAttention's variable-length kernel twice and a compiled merge);
- `varlen_attention`, `gqa_attention`: attention paths through PyTorch's own kernels (packed variable-length segments
  with their partition sums; grouped-query heads under a mask without key/value copies).

Only torch and Triton are imported here; the Triton modules import `triton` at the top, so they are imported where a
kernel is about to run (`triton_runs_on`).
"""

from __future__ import annotations

import importlib.util

import torch


def triton_runs_on(device: torch.device) -> bool:
    """Whether the project's Triton kernels can run on `device`: CUDA with Triton installed, on a GPU Triton compiles
    for (compute capability 7.0 or later)."""
    return (
        device.type == "cuda"
        and importlib.util.find_spec("triton") is not None
        and torch.cuda.get_device_capability(device) >= (7, 0)
    )
