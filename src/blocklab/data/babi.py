"""bAbI's first five question-answering tasks as a seeded world simulation (Weston et al. 2015,
"Towards AI-Complete Question Answering", arXiv 1502.05698; written from the task definitions
of facebookarchive/bAbI-tasks, not from its released files).

A small world — actors, the six rooms, three objects — is simulated one action at a time: an
actor moves, picks an object up, drops it, or gives it to someone in the same room; every action
is checked against the world state before it is told, and the answer is read off the simulated
state (never templated in):

- ``qa1`` single supporting fact: "Mary moved to the bathroom." ... "Where is Mary?"
- ``qa2`` two supporting facts: objects carried about — "Where is the football?" (the room of
  whoever holds it, or where it was dropped).
- ``qa3`` three supporting facts: "Where was the apple before the kitchen?" (the room the
  object was in before the room it is in now).
- ``qa4`` two-argument relations: "The office is north of the bedroom." ... "What is north of
  the bedroom?" / "What is the bedroom south of?".
- ``qa5`` three-argument relations: "Fred gave the milk to Bill." ... "Who received the milk?"
  / "What did Fred give to Bill?" / "Who gave the milk?".

Every question has exactly one answer, one of the task's labels (:data:`TASK_LABELS`, the label
sets BABILong scores with — booydar/babilong ``metrics.py``): a question that the story leaves
ambiguous is never asked (another story is drawn). The sentences are bAbI's templates
(``stringify.lua`` and the released v1.2 files); actors are bAbI's (qa1–qa3: John, Mary, Sandra,
Daniel; qa5: Bill, Fred, Jeff, Mary).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

TASKS = ("qa1", "qa2", "qa3", "qa4", "qa5")

LOCATIONS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
OBJECTS = ("apple", "football", "milk")
ACTORS = ("John", "Mary", "Sandra", "Daniel")
ACTORS_QA5 = ("Bill", "Fred", "Jeff", "Mary")

#: BABILong's label sets (booydar/babilong ``metrics.py``): the answers a task can have.
TASK_LABELS: dict[str, tuple[str, ...]] = {
    "qa1": LOCATIONS, "qa2": LOCATIONS, "qa3": LOCATIONS, "qa4": LOCATIONS,
    "qa5": ("Bill", "Fred", "Jeff", "Mary", "apple", "football", "milk"),
}

#: Every name a bAbI story of these tasks can use (a haystack avoids all of them).
VOCABULARY = tuple(sorted(set(LOCATIONS + OBJECTS + ACTORS + ACTORS_QA5)))

MOVES = ("{a} moved to the {l}.", "{a} went to the {l}.", "{a} went back to the {l}.",
         "{a} journeyed to the {l}.", "{a} travelled to the {l}.")
GETS = ("{a} picked up the {o}.", "{a} grabbed the {o}.", "{a} took the {o}.",
        "{a} got the {o}.", "{a} picked up the {o} there.", "{a} got the {o} there.")
DROPS = ("{a} dropped the {o}.", "{a} put down the {o}.", "{a} discarded the {o}.",
         "{a} left the {o}.", "{a} dropped the {o} there.", "{a} discarded the {o} there.")
GIVES = ("{a} gave the {o} to {b}.", "{a} handed the {o} to {b}.", "{a} passed the {o} to {b}.")
DIRECTIONS = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}

#: The usual story size (facts before the question) of each task, bAbI-like: (fewest, most).
STORY_FACTS = {"qa1": (2, 10), "qa2": (4, 16), "qa3": (6, 20), "qa4": (2, 2), "qa5": (4, 16)}
#: The fewest facts a question of each task can rest on.
MIN_FACTS = {"qa1": 1, "qa2": 2, "qa3": 3, "qa4": 2, "qa5": 4}


@dataclass(frozen=True)
class Story:
    """One bAbI item: ``facts`` (sentences in story order, each ending with "."), the
    ``question``, its ``answer`` (one of ``labels`` = :data:`TASK_LABELS` of ``task``) and the
    indices of the ``supporting`` facts (sorted)."""

    task: str
    facts: tuple[str, ...]
    question: str
    answer: str
    supporting: tuple[int, ...]
    labels: tuple[str, ...]


class _World:
    """Where each actor is (None: not told yet), who holds each object and where each object is
    (None: not told yet), with the index of the fact that last set each."""

    def __init__(self, actors: tuple[str, ...]) -> None:
        self.actors = actors
        self.at: dict[str, str | None] = dict.fromkeys(actors)
        self.moved: dict[str, int] = {}  # actor -> index of its last move
        self.holder: dict[str, str | None] = dict.fromkeys(OBJECTS)
        self.where: dict[str, str | None] = dict.fromkeys(OBJECTS)
        self.facts: list[str] = []
        # object -> [(room, supporting fact indices)] each time its room changes
        self.history: dict[str, list[tuple[str, tuple[int, ...]]]] = {o: [] for o in OBJECTS}
        self.last_get: dict[str, int] = {}
        self.last_drop: dict[str, tuple[int, int]] = {}  # object -> (drop fact, dropper's move)
        self.gives: list[tuple[str, str, str, int]] = []  # (giver, object, recipient, fact)

    def _room(self, obj: str, room: str, support: tuple[int, ...]) -> None:
        if self.where[obj] != room:
            self.history[obj].append((room, support))
        self.where[obj] = room

    def options(self, kinds: tuple[str, ...]) -> list[tuple]:
        out: list[tuple] = []
        for a in self.actors:
            if "move" in kinds:
                out += [("move", a, loc) for loc in LOCATIONS if loc != self.at[a]]
            if self.at[a] is None:
                continue  # an actor not yet placed handles nothing (its room would be unknown)
            for o in OBJECTS:
                if "get" in kinds and self.holder[o] is None and self.where[o] in (None,
                                                                                   self.at[a]):
                    out.append(("get", a, o))
                if self.holder[o] == a:
                    if "drop" in kinds:
                        out.append(("drop", a, o))
                    if "give" in kinds:
                        out += [("give", a, o, b) for b in self.actors
                                if b != a and self.at[b] == self.at[a]]
        return out

    def act(self, action: tuple, rng: random.Random) -> None:
        i = len(self.facts)
        kind, a = action[0], action[1]
        if kind == "move":
            loc = action[2]
            self.at[a], self.moved[a] = loc, i
            self.facts.append(rng.choice(MOVES).format(a=a, l=loc))
            for o in OBJECTS:
                if self.holder[o] == a:
                    self._room(o, loc, (i,))
        elif kind == "get":
            o = action[2]
            self.holder[o] = a
            self.last_get[o] = i
            self.facts.append(rng.choice(GETS).format(a=a, o=o))
            self._room(o, self.at[a], tuple(sorted((self.moved[a], i))))
        elif kind == "drop":
            o = action[2]
            self.holder[o] = None
            self.last_drop[o] = (i, self.moved[a])
            self.facts.append(rng.choice(DROPS).format(a=a, o=o))
        else:
            o, b = action[2], action[3]
            self.holder[o] = b
            self.last_get[o] = i
            self.gives.append((a, o, b, i))
            self.facts.append(rng.choice(GIVES).format(a=a, o=o, b=b))


def _simulate(actors: tuple[str, ...], kinds: tuple[str, ...], n: int,
              rng: random.Random) -> _World:
    world = _World(actors)
    for _ in range(n):
        options = world.options(kinds)
        # moves are most of any option list; draw the kind of action first, then the action
        by_kind: dict[str, list[tuple]] = {}
        for op in options:
            by_kind.setdefault(op[0], []).append(op)
        kind = rng.choice(sorted(by_kind))
        world.act(rng.choice(by_kind[kind]), rng)
    return world


def _qa1(world: _World, rng: random.Random) -> tuple[str, str, tuple[int, ...]] | None:
    placed = [a for a in world.actors if world.at[a] is not None]
    a = rng.choice(placed)
    return f"Where is {a}?", world.at[a], (world.moved[a],)


def _qa2(world: _World, rng: random.Random) -> tuple[str, str, tuple[int, ...]] | None:
    known = [o for o in OBJECTS if world.where[o] is not None]
    if not known:
        return None
    o = rng.choice(known)
    holder = world.holder[o]
    if holder is not None:
        support = (world.last_get[o], world.moved[holder])
    else:
        support = world.last_drop[o]
    return f"Where is the {o}?", world.where[o], tuple(sorted(set(support)))


def _qa3(world: _World, rng: random.Random) -> tuple[str, str, tuple[int, ...]] | None:
    # only where the room it is in now occurs once in its history: "before the kitchen" then
    # names one moment
    known = [o for o in OBJECTS if len(world.history[o]) >= 2
             and [r for r, _ in world.history[o]].count(world.where[o]) == 1]
    if not known:
        return None
    o = rng.choice(known)
    (before, s1), (now, s2) = world.history[o][-2:]
    return (f"Where was the {o} before the {now}?", before, tuple(sorted(set(s1 + s2))))


def _qa5(world: _World, rng: random.Random) -> tuple[str, str, tuple[int, ...]] | None:
    asks = []  # (question, which of (giver, object, recipient) answers it, which gives match)
    for a, o, b, _ in world.gives:
        asks += [(f"What did {a} give to {b}?", 1, lambda g, a=a, b=b: g[0] == a and g[2] == b),
                 (f"Who gave the {o}?", 0, lambda g, o=o: g[1] == o),
                 (f"Who received the {o}?", 2, lambda g, o=o: g[1] == o),
                 (f"Who did {a} give the {o} to?", 2,
                  lambda g, a=a, o=o: g[0] == a and g[1] == o),
                 (f"Who gave the {o} to {b}?", 0, lambda g, o=o, b=b: g[1] == o and g[2] == b)]
    rng.shuffle(asks)
    for question, slot, match in asks:
        hits = [g for g in world.gives if match(g)]
        if len({g[slot] for g in hits}) == 1:  # one answer whichever matching give is meant
            return question, hits[-1][slot], tuple(g[3] for g in hits[-1:])
    return None


def _qa4(rng: random.Random) -> Story:
    a, b, c = rng.sample(LOCATIONS, 3)
    d1, d2 = rng.sample(sorted(DIRECTIONS), 2)  # a is d1 of b; c lies d2 of b (another cell)
    facts = [f"The {a} is {d1} of the {b}."]
    rel = [(a, d1, b)]
    if rng.random() < 0.5:
        rel.append((c, d2, b))
    else:
        rel.append((b, OPPOSITE[d2], c))
    facts.append(f"The {rel[1][0]} is {rel[1][1]} of the {rel[1][2]}.")
    if rng.random() < 0.5:
        facts.reverse()
        rel.reverse()
    k = rng.randrange(2)
    x, d, y = rel[k]  # "x is d of y"
    form = rng.randrange(4)
    if form == 0:
        question, answer = f"What is {d} of the {y}?", x
    elif form == 1:
        question, answer = f"What is {OPPOSITE[d]} of the {x}?", y
    elif form == 2:
        question, answer = f"What is the {x} {d} of?", y
    else:
        question, answer = f"What is the {y} {OPPOSITE[d]} of?", x
    return Story("qa4", tuple(facts), question, answer, (k,), TASK_LABELS["qa4"])


_KINDS = {"qa1": ("move",), "qa2": ("move", "get", "drop"), "qa3": ("move", "get", "drop"),
          "qa5": ("move", "get", "give", "drop")}
_ASK = {"qa1": _qa1, "qa2": _qa2, "qa3": _qa3, "qa5": _qa5}


def story(task: str, rng: random.Random, *, n_facts: int | None = None) -> Story:
    """One story of ``task`` (one of :data:`TASKS`) drawn with ``rng``: ``n_facts`` facts before
    the question (None: the task's usual size, :data:`STORY_FACTS`; qa4 always has 2). The
    world is simulated until a story of that size admits a question with one answer (stories
    that do not are redrawn)."""
    if task not in TASKS:
        raise ValueError(f"bAbI task {task!r}: not one of {', '.join(TASKS)}")
    lo, hi = STORY_FACTS[task]
    if task == "qa4" and n_facts not in (None, 2):
        raise ValueError(f"bAbI qa4: n_facts={n_facts}; a qa4 story has exactly 2 facts")
    if n_facts is not None and n_facts < MIN_FACTS[task]:
        raise ValueError(f"bAbI {task}: n_facts={n_facts} is below the {MIN_FACTS[task]} "
                         "facts a question of this task needs")
    if task == "qa4":
        return _qa4(rng)
    for _ in range(1000):
        n = n_facts if n_facts is not None else rng.randint(lo, hi)
        world = _simulate(ACTORS_QA5 if task == "qa5" else ACTORS, _KINDS[task], n, rng)
        asked = _ASK[task](world, rng)
        if asked is not None:
            question, answer, support = asked
            return Story(task, tuple(world.facts), question, answer, support,
                         TASK_LABELS[task])
    raise RuntimeError(f"bAbI {task}: no answerable story of {n_facts} facts in 1000 draws")
