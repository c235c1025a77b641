"""The commands that compose the services: the `relayrl` CLI, the local stack, ctl, chaos, fuzz and the benches.

The top layer: it imports the shared core (`relayrl`) and the services; neither imports it.
"""
