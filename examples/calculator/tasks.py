"""Writes the calculator agent's tasks: `python examples/calculator/tasks.py` (deterministic).

Ten kinds of arithmetic, each phrased its own way. A 135M model cannot work the numbers out in
its head, so a task is solved by calling the calculator on the whole expression, written out
from the words; how often SmolLM2-135M-Instruct does that at first ranges from about 60% of
samples ("Compute 52 times 30.") to a few percent ("Add 345, 678 and 912."), which spreads the
learning over the whole run instead of saturating after a few updates. Training and validation
tasks are drawn alike, from different random numbers; no question appears in both.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
Kind = Callable[[random.Random], tuple[str, float]]


def two(rng: random.Random) -> int:
    return rng.randint(11, 99)


def three(rng: random.Random) -> int:
    return rng.randint(101, 999)


def times(rng: random.Random) -> tuple[str, float]:
    a, b = two(rng), two(rng)
    return f"Compute {a} times {b}.", a * b


def multiply(rng: random.Random) -> tuple[str, float]:
    a, b = two(rng), two(rng)
    return f"Multiply {a} by {b}.", a * b


def product(rng: random.Random) -> tuple[str, float]:
    a, b = two(rng), two(rng)
    return f"Find the product of {a} and {b}.", a * b


def two_products(rng: random.Random) -> tuple[str, float]:
    a, b, c, d = two(rng), two(rng), two(rng), two(rng)
    return f"What is {a} * {b} + {c} * {d}?", a * b + c * d


def minus_product(rng: random.Random) -> tuple[str, float]:
    x, a, b = three(rng), two(rng), two(rng)
    return f"What is {x} - {a} * {b}?", x - a * b


def divided(rng: random.Random) -> tuple[str, float]:
    a, b = two(rng), two(rng)
    return f"What is {a * b} divided by {a}?", b


def squared(rng: random.Random) -> tuple[str, float]:
    a = two(rng)
    return f"What is {a} squared?", a * a


def twice(rng: random.Random) -> tuple[str, float]:
    x, a = three(rng), two(rng)
    return f"What is twice {x} plus {a}?", 2 * x + a


def add(rng: random.Random) -> tuple[str, float]:
    x, y, z = three(rng), three(rng), three(rng)
    return f"Add {x}, {y} and {z}.", x + y + z


def percent(rng: random.Random) -> tuple[str, float]:
    p, x = rng.choice([10, 20, 25, 30, 40, 50, 60, 75]), rng.randint(2, 99) * 4
    return f"What is {p}% of {x}?", p * x / 100


KINDS: dict[str, Kind] = {k.__name__: k for k in (times, multiply, product, two_products)}
KINDS |= {k.__name__: k for k in (minus_product, divided, squared, twice, add, percent)}


def draw(
    rng: random.Random, kinds: dict[str, Kind], per_kind: int, seen: set[str]
) -> list[dict[str, object]]:
    tasks = []
    for _ in range(per_kind):
        for name, kind in kinds.items():
            question, answer = kind(rng)
            while question in seen:
                question, answer = kind(rng)
            seen.add(question)
            tasks.append({"question": question, "answer": answer, "kind": name})
    return tasks


def write(folder: Path, kinds: dict[str, Kind], val_per_kind: int, train_per_kind: int) -> None:
    """`val.jsonl`, then (from the same random stream, no question repeated) a shuffled `tasks.jsonl`."""
    rng, seen = random.Random(2026), set[str]()
    val = draw(rng, kinds, val_per_kind, seen)
    train = draw(rng, kinds, train_per_kind, seen)
    rng.shuffle(train)
    for name, tasks in (("tasks.jsonl", train), ("val.jsonl", val)):
        (folder / name).write_text("".join(json.dumps(t) + "\n" for t in tasks))


def main() -> None:
    write(HERE, KINDS, 4, 16)  # 40 held-out tasks, 160 training tasks


if __name__ == "__main__":
    main()
