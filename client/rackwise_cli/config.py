"""Where the client finds its server and token: ``RACKWISE_SERVER`` and
``RACKWISE_TOKEN`` first, else the file ``rackwise login`` wrote
(``$XDG_CONFIG_HOME/rackwise/config.yaml``, default ``~/.config/rackwise/``),
readable by its owner only (0600): it holds a secret."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from rackwise_cli.api import USAGE, CliError

DEFAULT_SERVER = "http://127.0.0.1:8000"


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "rackwise" / "config.yaml"


@dataclass
class Config:
    server: str
    token: str | None
    source: str  # where the token came from, for messages


def load() -> Config:
    """The environment's server and token over the file's."""
    stored: dict = {}
    path = config_path()
    if path.exists():
        try:
            stored = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise CliError(f"cannot read {path}: {exc}", code=USAGE) from exc
        if not isinstance(stored, dict):
            raise CliError(f"{path} is not a mapping of server and token", code=USAGE)
    server = os.environ.get("RACKWISE_SERVER") or stored.get("server") or DEFAULT_SERVER
    token = os.environ.get("RACKWISE_TOKEN") or stored.get("token")
    source = "RACKWISE_TOKEN" if os.environ.get("RACKWISE_TOKEN") else str(path)
    return Config(server=str(server), token=str(token) if token else None, source=source)


def save(server: str, token: str) -> Path:
    """Write the file with mode 0600 from its creation (never readable by others,
    not even for a moment), in a directory only its owner can enter."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump({"server": server, "token": token}, f)
    os.chmod(tmp, 0o600)  # an older tmp file may have had another mode
    os.replace(tmp, path)
    return path
