"""`python -m ragen_lit diagnose`: the template-collapse MI family (docs/METHOD.md §3) of a model on a rollouts file.

Input is JSONL, one object per reasoning sample, the format `fit` writes with `logging.save_rollouts=true`:
`prompt` (decoded prompt text with its chat markup, ending with the opening `<think>`), `reasoning`
(the text inside `<think>…</think>`) and `group` (int or str; rows of one group share one prompt).
Other fields are ignored; blank lines are skipped silently. Both texts are tokenized with
`add_special_tokens=False`, since the prompt text already holds the chat markup.

Columns are the distinct groups, in order of first appearance; a column's prompt is its group's first
usable row's prompt, and a row's true column is its group's. Columns whose prompts are token-identical form
one column group (a hit on any copy counts), exactly as in training (`diagnostics.column_groups_of`).

A bad row is skipped and counted by reason, with its first line numbers, in the report: a line that is
not a JSON object, a missing or ill-typed field, reasoning that tokenizes to nothing, a row too long to score
(below), or a prompt whose tokens differ from its group's first usable prompt. The last one breaks the file's
promise that a group is one prompt: scoring that row against its group's column would measure the wrong pair,
and giving it a column of its own would silently change N and the chance level, so the row is dropped instead.
Problems with the file or the model as a whole raise `ConfigError` (one line on stderr, exit code 2): the file
is missing or unreadable, no row is usable, fewer than 2 distinct prompts remain, or the model cannot be loaded.

Every reasoning is scored under every column prompt, so each pair must fit the token limit: the model's context
length, or `--max-tokens` where that is lower. A row whose prompt + reasoning exceeds it is skipped, and so is a
row whose reasoning does not fit after the longest column prompt (a column prompt comes from a row that fits, so
dropping these rows never leaves a pair too long). The check is cheap for any row size: a row with more
characters than the limit times the longest token's length in characters (a bound that holds for tokenizers that
do not drop characters: byte-level BPE, SentencePiece, WordPiece) cannot fit and is skipped before it is
tokenized, and every text tokenized is therefore bounded.

`--model` takes a run folder or one of its checkpoints as well (`ragen_lit.run.trained_policy`): the trained policy.
"""

from ragen_lit.diagnose.report import format_report, table_rows
from ragen_lit.diagnose.rollouts import RolloutRow, SkippedRows, read_rollouts
from ragen_lit.diagnose.run import DiagnoseOptions, resolve_model, run_diagnose
from ragen_lit.diagnose.scoring import DiagnoseResult, diagnose_rollouts

__all__ = [
    "DiagnoseOptions",
    "DiagnoseResult",
    "RolloutRow",
    "SkippedRows",
    "diagnose_rollouts",
    "format_report",
    "read_rollouts",
    "resolve_model",
    "run_diagnose",
    "table_rows",
]
