"""Benchmarks of the project's own code, one module per benchmark (`step`, `update`, `filter`,
`diagnostics`, `engine`, `envs`) plus what they share (`common`, `machine`, `random_model`). Each prints a table
with the machine, the date and every figure; `scripts/bench_<name>.py` runs it. Nothing else in the
package imports from here."""
