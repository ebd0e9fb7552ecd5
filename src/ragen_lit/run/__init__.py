"""A run's life outside the RL itself, one module per concept:

- its entrance: `opening` (`open_run`, which `fit` calls once: the folder, its lock, the record and the store,
  handed back as `folder.Run`, what the loggers, the callbacks and the end-of-run record take instead of the config);
- before it starts: `preflight` (installed packages, local paths, one built env, then `bounds`: this machine's, the
  model's and the env's);
- its folder and record: `folder` (which folder a `fit` trains, `run.json`, the resume rules, the end-of-run
  summary), `lock` (one process trains a folder at a time), `provenance` (the code and weights it was made from);
- MLflow and the other loggers: `store` (where the store is, its checks, opening it), `loggers` (MLflow's `RunLogger`,
  the run's record, and TensorBoard, CSV, W&B beside it), `console` (what `fit` prints);
- its checkpoints: `checkpoints` (their names, which one stands for a run), `checkpoint_writer` (how `fit` writes
  them), `trained_policy` (the policy in one, and `export`);
- when it ends badly: `faults` (a fault of the machine told in one line), `killed_runs` (a killed `fit`'s MLflow run
  marked KILLED by the next one).

It stands on `config` (and on the model loaders and presets, where a checkpoint's policy is rebuilt or a model's shape
read); `training/`, `evaluation/`, `diagnose/`, `analysis/` and the command line use it, and it imports none of them.
This file imports nothing, so that a light module of the room (the checks before a run, the checkpoint rule, the
lock) loads without Lightning or torch.
"""
