"""A rollout replica: leases prompts, drives one engine over SGLang's HTTP API, scores and pushes groups."""
