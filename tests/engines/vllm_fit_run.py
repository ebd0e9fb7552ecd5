"""`python tests/engines/vllm_fit_run.py [--partial-sync] fit ...`: the `python -m ragen_lit` CLI in
this process (vLLM in-process must own it), for `test_vllm_fit.py`.

`--partial-sync` sabotages the weight sync the way a backend bug would: the MLP weights are never
pushed, so vLLM keeps sampling with their initial values while the trainer moves on.
"""

from __future__ import annotations

import sys

from ragen_lit import cli
from ragen_lit.engines import vllm as vllm_engine


def mlp_weights_withheld(model, dtype=None):
    return ((name, tensor) for name, tensor in full_trainer_weights(model, dtype) if ".mlp." not in name)


full_trainer_weights = vllm_engine.trainer_weights

if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--partial-sync":
        args = args[1:]
        vllm_engine.trainer_weights = mlp_weights_withheld
    sys.exit(cli.main(args))
