"""The reward: verl's compute_score signature; return a float or a dict with a "score" key."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str.strip().startswith(ground_truth) else 0.0
