"""``relayrl chaos``: a training stack under injected faults, and the accounting of its promise."""
