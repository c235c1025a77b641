"""Built-in verifiable tasks: a prompt generator and a rule-based scorer for each.

Rows are in verl's format (``prompt`` as chat messages, ``data_source``, ``ability``,
``reward_model: {ground_truth, style}``, ``extra_info``), so the trainer loads them exactly
like a user's parquet file, and each scorer has verl's ``compute_score`` signature.
"""

from relayrl.tasks.registry import TASKS, Task, get_task, make_rows, score_builtin

__all__ = ["TASKS", "Task", "get_task", "make_rows", "score_builtin"]
