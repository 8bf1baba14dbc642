"""Writes the QA example's corpus and tasks: `python examples/agents_qa/data.py` (deterministic).

The corpus describes an invented valley, Veldmark: its towns and rivers, one short passage each,
so the answers come from the corpus and not from what a model remembers. Questions ask for one
fact of one passage (a town's founding year, trade, mayor or river; a river's length, source or
mouth), some for a fact two passages apart (the source of the river a town lies on). It owns the
data, not the agent or its reward (`agent.py`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOWNS = [
    *["Orlen", "Brevik", "Tamsel", "Kestow", "Ardum", "Velsey", "Marrow", "Quillon"],
    *["Dunmere", "Hollis", "Saltry", "Penfold", "Crask", "Ebbing", "Fallow", "Gorsey"],
    *["Hythe", "Ivel", "Jarrow", "Lunde", "Moss Fen", "Nether Cray", "Oakhollow", "Pridd"],
    *["Rushby", "Stennet", "Tolling", "Upwick", "Wendle", "Yarrow"],
]
TRADES = [
    *["blue glass", "river pearls", "goat cheese", "copper bells", "linen", "slate roofs"],
    *["honey mead", "clocks", "wool blankets", "paper", "barrels", "candles", "rope", "pottery"],
    *["saddles", "ink"],
]
FIRST = ["Ilse", "Tomas", "Wren", "Odile", "Bram", "Signe", "Pell", "Ansel", "Mira", "Corin"]
FIRST += ["Hedda", "Lorcan"]
LAST = ["Harrow", "Vance", "Quist", "Dorrel", "Fenwick", "Ashby", "Morrow", "Castell", "Brin"]
LAST += ["Tallis"]
RIVERS = [
    ("Sarn", "Mount Orrin", "Lake Vey"),
    ("Idle", "Mount Keld", "Lake Vey"),
    ("Wyre", "Mount Orrin", "the Grey Sea"),
    ("Colne", "Mount Baskar", "Lake Tarn"),
    ("Lisk", "Mount Keld", "the Grey Sea"),
    ("Brae", "Mount Ulla", "Lake Tarn"),
    ("Ember", "Mount Baskar", "Lake Moor"),
    ("Fane", "Mount Ulla", "the Grey Sea"),
]


def build() -> tuple[list[dict], list[dict], list[dict]]:
    """(corpus, train tasks, val tasks): 38 passages, 30 train and 15 val questions, none asked twice."""
    rng = random.Random(23)
    corpus, questions = [], []
    mayors = rng.sample([f"{f} {last}" for f in FIRST for last in LAST], len(TOWNS))
    years = rng.sample(range(1420, 1890), len(TOWNS))
    trades = [TRADES[i % len(TRADES)] for i in range(len(TOWNS))]
    rng.shuffle(trades)
    river_of = {}
    for i, (name, mayor, year, trade) in enumerate(zip(TOWNS, mayors, years, trades, strict=True)):
        river = RIVERS[i % len(RIVERS)][0]
        river_of[name] = river
        text = (
            f"{name} is a town in the Veldmark valley on the river {river}, founded in {year}. "
            f"It is known for its {trade}. The current mayor of {name} is {mayor}."
        )
        corpus.append({"id": f"town-{i}", "title": name, "text": text})
        questions += [
            {"question": f"In what year was {name} founded?", "answer": str(year), "kind": "year"},
            {
                "question": f"What is the town of {name} known for?",
                "answer": trade,
                "kind": "trade",
            },
            {"question": f"Who is the mayor of {name}?", "answer": mayor, "kind": "mayor"},
            {"question": f"On which river does {name} lie?", "answer": river, "kind": "river"},
        ]
    for i, (river, source, mouth) in enumerate(RIVERS):
        length = rng.randrange(40, 400)
        text = (
            f"The {river} is a river of Veldmark, {length} kilometres long. "
            f"It rises on {source} and flows into {mouth}."
        )
        corpus.append({"id": f"river-{i}", "title": f"River {river}", "text": text})
        questions += [
            {
                "question": f"How long is the river {river}, in kilometres?",
                "answer": str(length),
                "kind": "length",
            },
            {
                "question": f"On which mountain does the river {river} rise?",
                "answer": source,
                "kind": "source",
            },
        ]
    sources = {river: source for river, source, _ in RIVERS}
    questions += [
        {
            "question": f"On which mountain does the river that flows through {town} rise?",
            "answer": sources[river_of[town]],
            "kind": "two-hop",
        }
        for town in TOWNS
    ]
    rng.shuffle(questions)
    return corpus, questions[:30], questions[30:45]


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    corpus, train, val = build()
    write(HERE / "corpus.jsonl", corpus)
    write(HERE / "tasks.jsonl", train)
    write(HERE / "val.jsonl", val)


if __name__ == "__main__":
    main()
