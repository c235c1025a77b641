from commands.stack.monitor import RULES_FILE, prometheus_config


def test_every_component_is_scraped_under_its_kind():
    services = {
        "queue": "http://127.0.0.1:4001",
        "trainer": "http://127.0.0.1:4002",
        "rollout-0": "http://127.0.0.1:4003",
        "rollout-1": "http://127.0.0.1:4004",
    }
    config = prometheus_config(services, [RULES_FILE])
    jobs = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert jobs == {
        "queue": ["127.0.0.1:4001"],
        "trainer": ["127.0.0.1:4002"],
        "rollout": ["127.0.0.1:4003", "127.0.0.1:4004"],
    }
    assert RULES_FILE.is_file() and config["rule_files"] == [str(RULES_FILE)]
