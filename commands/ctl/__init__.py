"""``relayrl ctl``: pause, resume, checkpoint and inspect a running deployment over its APIs.

Rollout replicas and the trainer are steered through their REST control routes (bearer
token); the queue and paramsync report their state over gRPC (``Stats``, ``ListReplicas``).
Endpoints and the token come from :class:`commands.ctl.config.CtlSettings`.
"""
