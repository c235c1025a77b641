"""What ``GET /control/groups/{id}`` answers, read back from a run's groups.jsonl: trained groups
with their step and version, dropped ones with the reason, the last line winning after a resume."""

import json

from services.trainer.group_fate import GroupFates


def test_fates_are_read_back_from_groups_jsonl_and_a_resumed_step_supersedes_the_lines_after_it(tmp_path):
    path = tmp_path / "groups.jsonl"
    lines = [
        {"step": 1, "version": 0, "group_ids": ["a", "b"], "ages": [0, 0]},
        {"dropped": "stale", "group_ids": ["c"]},
        {"step": 2, "version": 1, "group_ids": ["e"], "ages": [0]},
        # A trainer resumed from step 0 trains step 1 again: b and e went back to the queue.
        {"step": 1, "version": 0, "group_ids": ["a", "d"], "ages": [0, 1]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 2, "vers')
    fates = GroupFates.read(path)
    assert fates.get("a").to_json() == {"group_id": "a", "status": "trained", "step": 1, "version": 0, "reason": ""}
    assert fates.get("c").status == "dropped" and fates.get("c").reason == "stale"
    assert fates.get("d").status == "trained" and fates.get("nobody") is None
    assert fates.get("b") is None and fates.get("e") is None, "superseded by the resumed steps"
    assert GroupFates.read(tmp_path / "none.jsonl").get("a") is None
