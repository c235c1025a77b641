"""Python stubs generated from ``protos/relayrl/v1`` by ``make proto``. Do not edit by hand."""
