"""Multi-turn episodes in the rollout: the agent loop per sample, tools and interactions in verl's format.

| module | job |
| --- | --- |
| ``parser.py`` | Hermes ``<tool_call>`` parsing into calls and error observations |
| ``tools.py`` | verl's ``BaseTool`` and the tool-config YAML (``tools: - class_name, config, tool_schema``) |
| ``interactions.py`` | verl's ``BaseInteraction`` and the interaction-config YAML |
| ``execution.py`` | tool calls run concurrently under a replica-wide limit and a timeout |
| ``rendering.py`` | observation messages as exact token ids through the model's chat template |
| ``episode.py`` | generate → parse → tools / interaction → observation → generate, per sample |
| ``runtime.py`` | everything an episode needs, loaded once per replica from the settings |
"""
