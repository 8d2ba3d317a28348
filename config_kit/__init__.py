"""Settings declared once: a component's frozen dataclass declares each of its settings with
`setting(...)` (default, help, bounds or choices, how `splitserve up` and the Helm chart hand
it on), and everything else is generated from those declarations: command-line flags, the
SPLITSERVE_* environment, `up`'s forwarding, the chart's values schema. Torch-free and
importable by every package."""

from config_kit.declare import Declared, Helm, Up, declared, setting
from config_kit.flags import add_flags, given_flags
from config_kit.given import Given, part
from config_kit.load import ENV_PREFIX, SettingsError, build, load
from config_kit.values import Secret, SettingError, check_fields

__all__ = [
    "ENV_PREFIX",
    "Declared",
    "Given",
    "Helm",
    "Secret",
    "SettingError",
    "SettingsError",
    "Up",
    "add_flags",
    "build",
    "check_fields",
    "declared",
    "given_flags",
    "load",
    "part",
    "setting",
]
