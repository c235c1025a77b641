"""``python -m services.trainer`` (what torchrun launches): same as ``relayrl trainer run``."""

from services.trainer.cli import app

if __name__ == "__main__":
    app(["run"])
