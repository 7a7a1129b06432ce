"""Running a benchmark script's ``--child`` mode in a fresh process (shared by the harnesses)."""

from __future__ import annotations

import json
import os
import subprocess


def run_child(script: str, python: str, args: list[str], *, timeout: float = 1800) -> dict:
    """``python script *args --child``; its last stdout line as JSON, or ``{"error": stderr tail}``.
    Children cache bytecode, as a pip install has it."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    r = subprocess.run([python, script, *args, "--child"], capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout)[-1500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])
