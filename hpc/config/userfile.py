"""The user's own layer of every config: the `notify:` section of their cluster file.

    HPC_CLUSTERS_FILE=~/clusters.yaml python -m hpc.submit run --dry-run -- python train.py

The file is the one that names the user's clusters (hpc.remote.clusters): ~/.config/hpc/clusters.yaml
($XDG_CONFIG_HOME/hpc/ where set; HPC_CLUSTERS_FILE names another). Its top-level `notify:` (the
keys of hpc.config.schema.NotifySettings) is merged into every run submitted from this machine:
above the pipeline's templates, under the run's saved config, a profile and the command line, so a
run's own notify wins key by key. A named cluster's `notify:` travels with a submission to it
(hpc.remote.clusters.notify_overrides). load() reads the file's text for the config cache's key;
YAML is parsed only when a config is built, and only from a file that has a top-level notify.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from hpc.config.checks import ConfigError

ENV = "HPC_CLUSTERS_FILE"
KEY = "notify"  # the file's one top-level key that names no cluster
HAS_KEY = re.compile(rf"^{KEY}\s*:", re.M)


def path(environ: Mapping[str, str] = os.environ) -> Path:
    if environ.get(ENV):
        return Path(environ[ENV]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "hpc" / "clusters.yaml"


def read(environ: Mapping[str, str] = os.environ) -> str:
    """The file's text when it has a top-level notify:, else '' (no file: ''; one that cannot be read:
    a ConfigError, since the runs would go out without the notify the user set)."""
    where = path(environ)
    try:
        text = where.read_text()
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: cannot be read ({getattr(err, 'strerror', None) or err}); expected the user's "
                          f"cluster file. HINT: fix its permissions, or point {ENV} at another file.") from None
    return text if HAS_KEY.search(text) else ""


def section(text: str, environ: Mapping[str, str] = os.environ) -> Dict[str, Any]:
    """The top-level notify: of the file's text ({} without one); a ConfigError naming the file for
    anything but a mapping."""
    if not text:
        return {}
    import yaml  # a config being built, or a submission to a named cluster: yaml is loaded already

    try:
        found = (yaml.safe_load(text) or {}).get(KEY)
    except (yaml.YAMLError, AttributeError):
        found = None
    if not isinstance(found, dict):
        raise ConfigError(f"{path(environ)} ({KEY}:): a {type(found).__name__}; expected a mapping of a run's "
                          "notify keys, such as webhook: URL. HINT: see docs/monitoring.md#notifications.")
    return found


def layer(text: str, environ: Mapping[str, str] = os.environ) -> Optional[Tuple[Any, str]]:
    """({'notify': ...} of the file's text as a config layer, its origin); None without one."""
    found = section(text, environ)
    if not found:
        return None
    from omegaconf import OmegaConf  # a config being built: OmegaConf is loaded already

    return OmegaConf.create({KEY: found}), f"{path(environ)} ({KEY}:)"
