"""Built-in verifiable tasks: a prompt generator and a rule-based scorer for each.

Rows are in verl's format (``prompt`` as chat messages, ``data_source``, ``ability``,
``reward_model: {ground_truth, style}``, ``extra_info``), so the trainer loads them exactly
like a user's parquet file, and each scorer has verl's ``compute_score`` signature.
``make_sft_rows`` gives demonstrations of the same questions in verl's SFT format
(``prompt``/``response``) for a warm start.
"""

from relayrl.tasks.registry import TASKS, Task, get_task, make_rows, make_sft_rows, score_builtin

__all__ = ["TASKS", "Task", "get_task", "make_rows", "make_sft_rows", "score_builtin"]
