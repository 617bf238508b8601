"""A small typed knowledge graph for the entity-type tests (PyTorch-BigGraph's entity types):
people like films and follow people, films have a genre, and films are bags of words."""

from __future__ import annotations

import random
from pathlib import Path

PEOPLE, FILMS, GENRES, WORDS = 60, 40, 4, 12


def typed_kg(d: Path) -> list:
    """A small typed knowledge graph by name: people like films and follow people, films have a
    genre; each film's genre decides which people like it. Films are bags of words (two films
    share one bag). Returns the converter's arguments."""
    rng = random.Random(5)
    genre = {f: f % GENRES for f in range(FILMS)}
    lines = []
    for p in range(PEOPLE):
        taste = p % GENRES
        for f in rng.sample([f for f in range(FILMS) if genre[f] == taste], 5):
            lines.append(f"p{p}\tlikes\tf{f}")
        lines.append(f"p{p}\tfollows\tp{(p + GENRES) % PEOPLE}")
    lines += [f"f{f}\thas_genre\tg{genre[f]}" for f in range(FILMS)]
    rng.shuffle(lines)
    (d / "kg.tsv").write_text("\n".join(lines) + "\n")
    (d / "node_types.tsv").write_text("person\nfilm\ngenre\n")
    (d / "edge_types.tsv").write_text("person\tlikes\tfilm\nperson\tfollows\tperson\nfilm\thas_genre\tgenre\n")
    bags = [f"f{f}\tw{genre[f]} w{GENRES + f % 8}" for f in range(FILMS - 1)]
    bags.append(f"f{FILMS - 1}\t" + bags[0].split("\t")[1])
    (d / "bags.tsv").write_text("# film<TAB>words\n" + "\n".join(bags) + "\n")
    return [
        d / "kg.tsv",
        "--columns", "src,rel,dst",
        "--node-types", d / "node_types.tsv",
        "--edge-types", d / "edge_types.tsv",
        "--node-bags", f"film={d / 'bags.tsv'}",
        "--split", "0.8,0.1,0.1",
    ]  # fmt: skip
