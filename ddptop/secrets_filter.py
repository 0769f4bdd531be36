"""Keep secrets on the host: filter environment variables and free text before they leave a rank.

Applied inside the reporter (so secrets never cross the wire: the environment, and the
free text a rank sends — its exception in ``exit_reason``, ``reporter.last_error``, the
Flight Recorder dump) and again when a bundle is written (defence in depth for files
recorded by older reporters).
"""

from __future__ import annotations

import re

# Name fragments that mark a variable as secret, whatever its value looks like.
SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE")
KNOWN_SECRETS = frozenset(
    ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY",
     "AWS_SESSION_TOKEN", "GITHUB_TOKEN", "OPENAI_API_KEY", "DDPTOP_TOKEN")
)
# Values that look like keys even under an innocent name: long runs of key alphabet,
# well-known prefixes, and credentials embedded in URLs.
_KEYLIKE = re.compile(
    r"(?:^|[^A-Za-z0-9])("
    r"(?:sk|pk|hf|ghp|gho|ghs|xox[abp]|AKIA|ASIA)[-_A-Za-z0-9]{12,}"
    r"|[A-Za-z0-9+_]{32,}={0,2}"
    r")"
)
_URL_CREDENTIALS = re.compile(r"(://[^/:@\s]+:)[^@\s]+@")
# "password=...", "api_key: ...", '"token": "..."' in free text (an exception message that
# quotes a config, a command line): the value after a secret-looking name. Matched from
# the secret word on ("tokenizer=" is not one), with bounded gaps: linear in any text.
_ASSIGNED = re.compile(
    r"(?i)(?:token|secrets?|passw(?:or)?ds?|(?:api|access|private)[_-]?keys?|credentials?|cookies?)"
    r"(?:[_.-][A-Za-z0-9_.-]{0,40})?[\"']?\s{0,4}[=:]\s{0,4}[\"']?([^\s\"',;&)}\]]+)"
)
MASK = "***"

# Prefixes of variables worth reporting at all (the rest of the environment stays home).
REPORTED_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "OMP_", "MASTER_", "GLOO_", "PYTORCH_",
                     "TORCHELASTIC_", "LOCAL_", "WORLD_", "RANK", "GROUP_", "ROLE_",
                     "DDPTOP_", "NVIDIA_", "MKL_", "KMP_", "HF_", "WANDB_")


def is_secret_name(name: str) -> bool:
    """True if a variable's name says it holds a secret."""
    upper = name.upper()
    return upper in KNOWN_SECRETS or any(part in upper for part in SECRET_NAME_PARTS)


def mask_value(value: str) -> str:
    """Mask key-like substrings, URL credentials and secret-named assignments inside *value*."""
    value = _URL_CREDENTIALS.sub(r"\1" + MASK + "@", value)
    value = _ASSIGNED.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + MASK, value)
    return _KEYLIKE.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + MASK, value)


def filter_env(environ: dict[str, str], prefixes: tuple[str, ...] = REPORTED_PREFIXES) -> dict[str, str]:
    """Return the reportable, secret-free subset of *environ*.

    Secret-named variables are kept by name with a masked value, so a user still sees
    that ``HF_TOKEN`` was set without seeing it.
    """
    out: dict[str, str] = {}
    for name in sorted(environ):
        if not name.startswith(prefixes):
            continue
        out[name] = MASK if is_secret_name(name) else mask_value(environ[name])
    return out
