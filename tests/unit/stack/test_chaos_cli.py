import pytest
import typer

from relayrl.stack.chaos.cli import parse_duration
from relayrl.stack.chaos.run import passed


def test_durations_read_as_users_write_them():
    assert parse_duration("15m") == 900 and parse_duration("90s") == 90 and parse_duration("1h") == 3600
    assert parse_duration("45") == 45
    for bad in ("", "0m", "15 minutes", "-5s"):
        with pytest.raises(typer.BadParameter, match="expected a duration"):
            parse_duration(bad)


def test_a_run_passes_only_with_every_zero_and_every_fault_recovered():
    zeros = dict(lost_groups=0, trained_twice=0, staleness_violations=0, version_regressions=0, stalls_over_30s=0)
    assert passed({**zeros, "unrecovered": 0})
    assert not passed({**zeros, "unrecovered": 1})
    for key in zeros:
        assert not passed({**zeros, key: 1, "unrecovered": 0})
