"""``relayrl sft``: supervised fine-tuning of a model directory with the trainer's FSDP2 pieces."""
