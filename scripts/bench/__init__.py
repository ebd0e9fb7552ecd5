"""Benchmarks of the project's own code, one module per benchmark (`step`, `update`, `filter`,
`diagnostics`, `engine`, `envs`, `scoring`, `scaling`, `fit`) plus what they share (`common`, `machine`,
`random_model`, `roofline`, `profiling`). Each prints a table with the machine, the date and every figure;
`scripts/bench_<name>.py` runs it.

They import `ragen_lit`; the package never imports them, and they are not installed with it: a script finds them
beside itself (`scripts/` is the first entry of its path), the tests through pytest's `pythonpath`."""
