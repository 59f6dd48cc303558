"""The prompts the BABILong probe kind (``eval/kinds/babilong.py``) reads its items with.

Two styles, each ending in ``Answer:`` (and the answer sentence up to the label) so that every label is scored as the continuation
``" " + label`` (forced choice) and the greedy generation starts at the same place:

- ``plain``: ``{context}\\n\\n{question} Answer:`` — the format of the training data
  (data/babilong.py ``PROMPT``), so a model trained on ``data=babilong`` is probed exactly as it
  was trained;
- the benchmark's own: BABILong's instruction, in-context examples and post-prompt, then
  ``<context>…</context>`` and ``Question: …`` (booydar/babilong ``prompts.py``,
  ``DEFAULT_TEMPLATE`` and ``DEFAULT_PROMPTS`` for qa1–qa5, quoted as published, typos
  included), in the tokenizer's chat template when ``probes.text.chat_template``; the answer
  opens with ``Answer:`` and, for qa1–qa3, the start of the sentence its examples answer with
  (``The most recent location of Mary is``; :data:`ANSWER_FORMS`), the label to follow.

Kuratov et al. 2024, "BABILong: Testing the Limits of LLMs with Long Context
Reasoning-in-a-Haystack", arXiv 2406.10149.
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: BABILong's template (booydar/babilong prompts.py); the result is ``.strip()``-ed.
TEMPLATE = ("{instruction}\n{examples}\n{post_prompt}\n<context>\n{context}\n</context>\n"
            "Question: {question}")

_LOC = ("I give you context with the facts about locations and actions of different persons "
        "hidden in some random text and a question. ")
_LOC_RULES = ("If a person got an item in the first location and travelled to the second "
              "location the item is also in the second location. If a person dropped an item in "
              "the first location and moved to the second location the item remains in the "
              "first location")

#: BABILong's instruction, examples and post-prompt of qa1–qa5 (booydar/babilong prompts.py).
PROMPTS: dict[str, dict[str, str]] = {
    "qa1": {
        "instruction":
            "I will give you context with the facts about positions of different persons hidden "
            "in some random text and a question. You need to answer the question based only on "
            "the information from the facts. If a person was in different locations, use the "
            "latest location to answer the question.",
        "examples":
            "<example>\nCharlie went to the hallway. Judith come back to the kitchen. Charlie "
            "travelled to balcony. Where is Charlie?\nAnswer: The most recent location of "
            "Charlie is balcony.\n</example>\n\n<example>\nAlan moved to the garage. Charlie "
            "went to the beach. Alan went to the shop. Rouse travelled to balcony. Where is "
            "Alan?\nAnswer: The most recent location of Alan is shop.\n</example>",
        "post_prompt":
            "Always return your answer in the following format: The most recent location of "
            "’person’ is ’location’. Do not write anything else after that. ",
    },
    "qa2": {
        "instruction":
            _LOC.rstrip() + "You need to answer the question based only on the information from "
            "the facts.\n" + _LOC_RULES + ".",
        "examples":
            "<example>\nCharlie went to the kitchen. Charlie got a bottle. Charlie moved to the "
            "balcony. Where is the bottle?\nAnswer: The bottle is in the balcony.\n</example>\n"
            "<example>\nAlan moved to the garage. Alan got a screw driver. Alan moved to the "
            "kitchen. Where is the screw driver?\nAnswer: The screw driver is in the kitchen.\n"
            "</example>",
        "post_prompt":
            "Always return your answer in the following format: The ’item’ is in ’location’. "
            "Do not write anything else after that.",
    },
    "qa3": {
        "instruction":
            _LOC + "You need to answer the question based only on the information from the "
            "facts.\n" + _LOC_RULES,
        "examples":
            "<example>\nJohn journeyed to the bedroom.Mary grabbed the apple. Mary went back to "
            "the bathroom. Daniel journeyed to the bedroom. Daniel moved to the garden. Mary "
            "travelled to the kitchen. Where was the apple before the kitchen?\nAnswer: Before "
            "the kitchen the apple was in the bathroom.\n</example>\n<example>\nJohn went back "
            "to the bedroom. John went back to the garden. John went back to the kitchen. Sandra "
            "took the football. Sandra travelled to the garden. Sandra journeyed to the bedroom. "
            "Where was the football before the bedroom?\nAnswer: Before the kitchen the football "
            "was in the garden.\n</example>",
        "post_prompt":
            "Always return your answer in the following format: Before the $location_1& the "
            "$item$ was in the $location_2$. Do not write anything else after that.",
    },
    "qa4": {
        "instruction":
            "I will give you context with the facts about different people, their location and "
            "actions, hidden in some random text and a question. You need to answer the "
            "question based only on the information from the facts.",
        "examples":
            "<example>\nThe hallway is south of the kitchen. The bedroom is north of the "
            "kitchen. What is the kitchen south of?\nAnswer: bedroom\n</example>\n<example>\n"
            "The garden is west of the bedroom. The bedroom is west of the kitchen. What is "
            "west of the bedroom?\nAnswer: garden\n</example>",
        "post_prompt":
            "Your answer should contain only one word - location. Do not write anything else "
            "after that.",
    },
    "qa5": {
        "instruction":
            "I will give you context with the facts about locations and their relations hidden "
            "in some random text and a question. You need to answer the question based only on "
            "the information from the facts.",
        "examples":
            "<example>\nMary picked up the apple there. Mary gave the apple to Fred. Mary moved "
            "to the bedroom. Bill took the milk there. Who did Mary give the apple to?\nAnswer: "
            "Fred\n</example>\n<example>\nJeff took the football there. Jeff passed the football "
            "to Fred. Jeff got the milk there. Bill travelled to the bedroom. Who gave the "
            "football?\nAnswer: Jeff\n</example>\n<example>\nFred picked up the apple there. "
            "Fred handed the apple to Bill. Bill journeyed to the bedroom. Jeff went back to the "
            "garden. What did Fred give to Bill?\nAnswer: apple\n</example>",
        "post_prompt":
            "Your answer should contain only one word. Do not write anything else after that. "
            "Do not explain your answer.",
    },
}

_MARK = "\x00CONTEXT\x00"  # where the context goes (never in a template or a haystack)
ANSWER = "Answer:"

#: The answer sentence BABILong's examples and post-prompt ask for, up to the label: the
#: assistant's turn opens with it (after ``Answer:``), so the labels are scored where the
#: examples put them and the generation goes on from there. qa4 and qa5 answer one word.
ANSWER_FORMS = {
    "qa1": (re.compile(r"^Where is (\w+)\?$"), "The most recent location of {0} is"),
    "qa2": (re.compile(r"^Where is the (\w+)\?$"), "The {0} is in the"),
    "qa3": (re.compile(r"^Where was the (\w+) before the (\w+)\?$"),
            "Before the {1} the {0} was in the"),
}


def answer_prefix(task: str, question: str) -> str:
    """``Answer:`` and the start of the answer sentence the task's examples use."""
    pattern, form = ANSWER_FORMS.get(task, (None, ""))
    m = pattern.match(question) if pattern is not None else None
    return ANSWER + (" " + form.format(*m.groups()) if m else "")


def frame(style_plain: bool, task: str, question: str, plain: str,
          chat: Callable[[str, str], str] | None) -> tuple[str, str]:
    """(text before the context, text after it) of one item's prompt: ``plain`` is the training
    format (``{context}``/``{question}`` placeholders); otherwise BABILong's prompt of
    ``task``, wrapped by ``chat(user message, assistant prefix)`` when given."""
    if style_plain:
        text = plain.format(context=_MARK, question=question)
    else:
        user = TEMPLATE.format(context=_MARK, question=question, **PROMPTS[task]).strip()
        prefix = answer_prefix(task, question)
        text = chat(user, prefix) if chat is not None else user + "\n" + prefix
    before, after = text.split(_MARK)
    return before, after
