"""The project's one cache directory, and the environment that keeps vLLM, torch and
Hugging Face writing inside it."""

import os
import secrets
from pathlib import Path


def probserve_home() -> Path:
    return Path(os.environ.get("PROBSERVE_HOME", Path.home() / ".cache" / "probserve"))


def models_dir() -> Path:
    return probserve_home() / "models"


def adapters_dir() -> Path:
    """Where the store builds its adapters: the default root adapters are loaded from."""
    return probserve_home() / "adapters"


def cache_environment(home: Path) -> dict[str, str]:
    """Variables that point every cache and socket the stack writes into `home`."""
    return {
        "PROBSERVE_HOME": str(home),
        "VLLM_CACHE_ROOT": str(home / "vllm"),
        "VLLM_RPC_BASE_PATH": str(home / "sockets"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "torchinductor"),
        "TRITON_CACHE_DIR": str(home / "triton"),
        "NUMBA_CACHE_DIR": str(home / "numba"),
        "HF_HOME": str(home / "huggingface"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TMPDIR": str(home / "tmp"),
    }


def apply_cache_environment() -> Path:
    """Sets the cache variables in this process (children inherit them); returns the home."""
    home = probserve_home()
    env = cache_environment(home)
    for folder in ("sockets", "tmp"):
        (home / folder).mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    return home


def keep_ray_token_at_home(home: Path) -> None:
    """Ray 2.60 turns its token authentication on for a local cluster and would keep the token
    in ~/.ray: keep it under PROBSERVE_HOME instead (made once, readable by its owner only),
    unless the environment names one."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    token = home / "ray" / "auth_token"
    if not token.exists():
        token.parent.mkdir(parents=True, exist_ok=True)
        token.touch(mode=0o600)
        token.write_text(secrets.token_hex(32))
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
