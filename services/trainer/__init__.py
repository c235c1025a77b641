"""The trainer service: dataset, FSDP2 training (PPO and GRPO with off-policy corrections),
checkpoints and publishing policy versions. Start it with ``relayrl trainer run`` under torchrun."""
