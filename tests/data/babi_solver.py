"""An independent bAbI qa1–qa5 solver for the tests: it reads only the story's text (sentences
and question) with its own patterns and its own bookkeeping, sharing nothing with
blocklab.data.babi. Every sentence must parse as a bAbI fact (else AssertionError) and every
question must have exactly one answer."""

from __future__ import annotations

import re

MOVE = re.compile(r"^(\w+) (?:moved|went|went back|journeyed|travelled) to the (\w+)\.$")
GET = re.compile(r"^(\w+) (?:picked up|grabbed|took|got) the (\w+)(?: there)?\.$")
DROP = re.compile(r"^(\w+) (?:dropped|put down|discarded|left) the (\w+)(?: there)?\.$")
GIVE = re.compile(r"^(\w+) (?:gave|handed|passed) the (\w+) to (\w+)\.$")
REL = re.compile(r"^The (\w+) is (north|south|east|west) of the (\w+)\.$")
FACT = (MOVE, GET, DROP, GIVE, REL)
OPP = {"north": "south", "south": "north", "east": "west", "west": "east"}


def is_fact(sentence: str) -> bool:
    return any(p.match(sentence) for p in FACT)


def solve(facts: list[str], question: str) -> str:
    at: dict[str, str] = {}
    holder: dict[str, str | None] = {}
    room: dict[str, str] = {}
    rooms: dict[str, list[str]] = {}  # object -> the rooms it has been in, in order
    gives: list[tuple[str, str, str]] = []
    rels: list[tuple[str, str, str]] = []  # (x, d, y): x is d of y, both ways round

    def put(obj: str, where: str) -> None:
        if room.get(obj) != where:
            rooms.setdefault(obj, []).append(where)
        room[obj] = where

    for f in facts:
        if m := MOVE.match(f):
            at[m[1]] = m[2]
            for o, h in holder.items():
                if h == m[1]:
                    put(o, m[2])
        elif m := GET.match(f):
            assert holder.get(m[2]) is None, f"{f!r}: the {m[2]} is held already"
            assert m[1] in at, f"{f!r}: {m[1]} is nowhere yet"
            assert room.get(m[2], at[m[1]]) == at[m[1]], f"{f!r}: not in {m[1]}'s room"
            holder[m[2]] = m[1]
            put(m[2], at[m[1]])
        elif m := DROP.match(f):
            assert holder.get(m[2]) == m[1], f"{f!r}: {m[1]} does not hold the {m[2]}"
            holder[m[2]] = None
        elif m := GIVE.match(f):
            assert holder.get(m[2]) == m[1], f"{f!r}: {m[1]} does not hold the {m[2]}"
            assert at.get(m[3]) == at[m[1]], f"{f!r}: {m[3]} is not in {m[1]}'s room"
            holder[m[2]] = m[3]
            gives.append((m[1], m[2], m[3]))
        elif m := REL.match(f):
            rels += [(m[1], m[2], m[3]), (m[3], OPP[m[2]], m[1])]
        else:
            raise AssertionError(f"not a bAbI fact: {f!r}")
    answers: set[str]
    if m := re.match(r"^Where is (\w+)\?$", question):
        answers = {at[m[1]]}
    elif m := re.match(r"^Where is the (\w+)\?$", question):
        answers = {room[m[1]]}
    elif m := re.match(r"^Where was the (\w+) before the (\w+)\?$", question):
        seen = rooms[m[1]]
        assert seen[-1] == m[2] and seen.count(m[2]) == 1, (seen, question)
        answers = {seen[-2]}
    elif m := re.match(r"^What is (north|south|east|west) of the (\w+)\?$", question):
        answers = {x for x, d, y in rels if d == m[1] and y == m[2]}
    elif m := re.match(r"^What is the (\w+) (north|south|east|west) of\?$", question):
        answers = {y for x, d, y in rels if x == m[1] and d == m[2]}
    elif m := re.match(r"^What did (\w+) give to (\w+)\?$", question):
        answers = {o for a, o, b in gives if a == m[1] and b == m[2]}
    elif m := re.match(r"^Who gave the (\w+)\?$", question):
        answers = {a for a, o, b in gives if o == m[1]}
    elif m := re.match(r"^Who received the (\w+)\?$", question):
        answers = {b for a, o, b in gives if o == m[1]}
    elif m := re.match(r"^Who did (\w+) give the (\w+) to\?$", question):
        answers = {b for a, o, b in gives if a == m[1] and o == m[2]}
    elif m := re.match(r"^Who gave the (\w+) to (\w+)\?$", question):
        answers = {a for a, o, b in gives if o == m[1] and b == m[2]}
    else:
        raise AssertionError(f"not a bAbI question: {question!r}")
    assert len(answers) == 1, f"{question!r}: answers {answers}"
    return answers.pop()
