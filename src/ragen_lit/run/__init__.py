"""A run's life outside the RL itself: what a run was made from (`provenance`), and the bookkeeping `fit`, `evaluate`
and `warm-start` share around it.

It stands on `config` (and the model loaders where a checkpoint is read back); `training/`, the commands and
`analysis/` use it, and it imports none of them. This file imports nothing, so that a light module of the room (the
checks before a run) loads without the heavy ones.
"""
