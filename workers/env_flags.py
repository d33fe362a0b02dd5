"""On/off switches read from the environment: "0", "false" or "no" (any case) is off, any other value on."""
import os


def env_flag(name: str, default: bool) -> bool:
    """The switch `name`; `default` when it is unset or empty."""
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in ("0", "false", "no")
