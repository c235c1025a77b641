"""The local stack: every RelayRL service as a process on one machine (``relayrl up``, ``relayrl demo``)."""
