"""Running a benchmark script's ``--child`` mode in a fresh process (shared by the harnesses)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Callable


def run_child(script: str, python: str, args: list[str], *, timeout: float = 1800) -> dict:
    """``python script *args --child``; its last stdout line as JSON, or ``{"error": stderr tail}``.
    Children cache bytecode, as a pip install has it."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    r = subprocess.run([python, script, *args, "--child"], capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout)[-1500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def interleaved_rounds(variants: list, rounds: int, run_one: Callable[[Any], dict], *, corpus: str,
                       out: str = "") -> None:
    """Run every variant once per round, the order rotated by one each round (no variant always
    first on a cold machine); each result, with its round and corpus name, is printed as one
    JSON line and appended to ``out`` when given."""
    for rnd in range(rounds):
        for variant in variants[rnd % len(variants):] + variants[:rnd % len(variants)]:
            row = run_one(variant)
            row.update(round=rnd, corpus=os.path.basename(corpus.rstrip("/")))
            print(json.dumps(row), flush=True)
            if out:
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
