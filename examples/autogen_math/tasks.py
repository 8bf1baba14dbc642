"""Writes the AutoGen math agent's tasks: `python -m examples.autogen_math.tasks` (deterministic).

Ten kinds of word problem, each with its own story; every answer is a whole number, and most take
two or three operations on two- and three-digit numbers, too many for a small model to work out in
its head: a task is solved by turning the words into an expression and handing it to the calculator.
Training and validation tasks are drawn alike, from different random numbers; no question appears
in both (the calculator example's `write`).
"""

from __future__ import annotations

import random
from pathlib import Path

from examples.calculator.tasks import Kind, write

HERE = Path(__file__).resolve().parent


def cookies(rng: random.Random) -> tuple[str, int]:
    trays, each, sold = rng.randint(12, 48), rng.randint(12, 36), rng.randint(101, 299)
    return (
        f"A baker fills {trays} trays with {each} cookies each and sells {sold} cookies. "
        "How many are left?",
        trays * each - sold,
    )


def buses(rng: random.Random) -> tuple[str, int]:
    buses, seats, empty = rng.randint(6, 19), rng.randint(41, 58), rng.randint(11, 39)
    return (
        f"A school sends {buses} buses with {seats} seats each on a trip, and {empty} seats stay empty. "
        "How many students go on the trip?",
        buses * seats - empty,
    )


def savings(rng: random.Random) -> tuple[str, int]:
    weekly, weeks = rng.randint(15, 45), rng.randint(13, 52)
    bike = rng.randint(90, weekly * weeks - 50)
    return (
        f"Mia saves {weekly} dollars a week for {weeks} weeks, then spends {bike} dollars on a bike. "
        "How many dollars does she have left?",
        weekly * weeks - bike,
    )


def orchard(rng: random.Random) -> tuple[str, int]:
    rows, trees, apples = rng.randint(11, 29), rng.randint(12, 31), rng.randint(23, 87)
    return (
        f"An orchard has {rows} rows of {trees} trees, and each tree gives {apples} apples. "
        "How many apples does the orchard give?",
        rows * trees * apples,
    )


def stickers(rng: random.Random) -> tuple[str, int]:
    children, each = rng.randint(13, 37), rng.randint(14, 48)
    return (
        f"{children * each} stickers are shared equally among {children} children. "
        "How many does each get?",
        each,
    )


def tickets(rng: random.Random) -> tuple[str, int]:
    adults, adult_price, kids = rng.randint(40, 180), rng.randint(12, 35), rng.randint(30, 150)
    kid_price = rng.randint(5, adult_price - 3)
    return (
        f"A theatre sells {adults} adult tickets at {adult_price} dollars and {kids} child tickets at "
        f"{kid_price} dollars. How many dollars does it take in?",
        adults * adult_price + kids * kid_price,
    )


def warehouse(rng: random.Random) -> tuple[str, int]:
    loads, per_load = rng.randint(12, 28), rng.randint(24, 64)
    stock = loads * per_load + rng.randint(150, 900)
    return (
        f"A warehouse holds {stock} boxes. Trucks take away {loads} loads of {per_load} boxes each. "
        "How many boxes remain?",
        stock - loads * per_load,
    )


def train_trip(rng: random.Random) -> tuple[str, int]:
    speed, hours, extra = rng.randint(62, 118), rng.randint(3, 9), rng.randint(17, 96)
    return (
        f"A train travels at {speed} km per hour for {hours} hours, then {extra} km more. "
        "How many km does it travel in all?",
        speed * hours + extra,
    )


def discount(rng: random.Random) -> tuple[str, int]:
    price, off = rng.randint(6, 49) * 20, rng.choice([10, 15, 20, 25, 30, 35, 40, 45, 60, 75])
    return (
        f"A jacket costs {price} dollars and is {off}% off. What is the sale price in dollars?",
        price * (100 - off) // 100,
    )


def reading(rng: random.Random) -> tuple[str, int]:
    per_day, days = rng.randint(13, 47), rng.randint(7, 19)
    pages = per_day * days + rng.randint(35, 240)
    return (
        f"A book has {pages} pages. Sam reads {per_day} pages a day for {days} days. "
        "How many pages are left?",
        pages - per_day * days,
    )


KINDS: dict[str, Kind] = {k.__name__: k for k in (cookies, buses, savings, orchard, stickers)}
KINDS |= {k.__name__: k for k in (tickets, warehouse, train_trip, discount, reading)}


def main() -> None:
    write(HERE, KINDS, 2, 4)  # 20 held-out tasks, 40 training tasks


if __name__ == "__main__":
    main()
