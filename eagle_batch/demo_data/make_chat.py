"""Generate eagle_batch/demo_data/chat.jsonl: small, original multi-turn chats for the demo (CC0-1.0).

    python -m eagle_batch.demo_data.make_chat            # rewrites chat.jsonl next to this file

Conversations are composed from hand-written topic templates below (arithmetic and unit conversions
are computed, so the answers are right), seeded, so the output is reproducible byte for byte.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SYSTEM_PROMPTS = [
    "You are a helpful assistant. Answer clearly and briefly.",
    "You are a patient tutor. Explain your reasoning step by step.",
    "You are a friendly assistant who keeps answers short.",
    "You are a precise technical assistant.",
]

OPENERS = ["", "", "", "Hi! ", "Quick question: ", "Hello. ", "Hey, ", "Can you help me? "]
THANKS = ["Thanks!", "Great, thank you.", "That helps, thanks.", "Perfect.", "Got it, thanks a lot."]
WELCOME = [
    "You're welcome!",
    "Glad it helped.",
    "Any time. Good luck!",
    "Happy to help.",
    "You're welcome. Ask again if anything else comes up.",
]

PYTHON_QA = [
    (
        "How do I reverse a list in Python?",
        "Use slicing: `items[::-1]` returns a reversed copy. To reverse in place, call `items.reverse()`.",
    ),
    (
        "How can I read a text file line by line in Python?",
        'Open it in a `with` block and iterate:\n\n```python\nwith open("notes.txt") as f:\n    for line in f:\n'
        "        print(line.rstrip())\n```\n\nThe file is closed automatically when the block ends.",
    ),
    (
        "What is the difference between a list and a tuple?",
        "A list is mutable: you can append, remove and change items. A tuple is immutable once created, "
        "which makes it hashable (usable as a dict key) when its items are hashable.",
    ),
    (
        "How do I count how often each word appears in a string?",
        "Split the string and use `collections.Counter`:\n\n```python\nfrom collections import Counter\n"
        "counts = Counter(text.lower().split())\nprint(counts.most_common(3))\n```",
    ),
    (
        "How do I sort a list of dictionaries by a key?",
        'Pass a key function to `sorted`: `sorted(rows, key=lambda r: r["age"])`. Add `reverse=True` '
        "for descending order.",
    ),
    (
        'What does `if __name__ == "__main__":` do?',
        "It runs the block only when the file is executed as a script, not when it is imported as a module. "
        "That keeps test or demo code from running on import.",
    ),
    (
        "How do I remove duplicates from a list but keep the order?",
        "Use a dict, which keeps insertion order: `list(dict.fromkeys(items))`.",
    ),
    (
        "How can I measure how long a function takes?",
        "Use `time.perf_counter()` before and after the call and subtract, or `timeit` for repeated runs:\n\n"
        "```python\nimport time\nstart = time.perf_counter()\nwork()\nprint(time.perf_counter() - start)\n```",
    ),
]
PYTHON_FOLLOWUPS = [
    (
        "Is that fast for large inputs?",
        "For most uses, yes: these built-ins are implemented in C. Sorting costs "
        "O(n log n); the other operations shown here are linear in the number of items.",
    ),
    (
        "Where can I read more about this?",
        "The official documentation at docs.python.org covers it in the "
        "tutorial and the library reference, with short runnable examples.",
    ),
    (
        "Does this work in older Python versions?",
        "It works in every supported Python 3 release. Only very old "
        "versions (before 3.7) did not guarantee dict insertion order, which the dict-based tricks rely on.",
    ),
]

COOKING_QA = [
    (
        "How long should I boil an egg for a soft yolk?",
        "About 6 minutes from when the egg goes into boiling water, then cool it in cold water for a minute.",
    ),
    (
        "How do I keep pasta from sticking together?",
        "Use plenty of water, stir during the first two minutes, and do not rinse it afterwards unless it is "
        "for a cold salad.",
    ),
    (
        "What can I use instead of buttermilk?",
        "Stir one tablespoon of lemon juice or vinegar into a cup of milk and let it stand for five minutes.",
    ),
    (
        "How do I make rice less mushy?",
        "Rinse it until the water runs clear, use a little less water (about 1.25 cups per cup of long-grain "
        "rice), and let it rest covered for ten minutes after cooking.",
    ),
    (
        "Why did my bread not rise?",
        "Common causes are old yeast, water that was too hot, or a cold kitchen. Test yeast in warm water "
        "with a pinch of sugar: it should foam within ten minutes.",
    ),
    (
        "How do I know when a steak is medium-rare?",
        "Use a thermometer: about 55 to 57 degrees Celsius in the center. Let it rest five minutes before cutting.",
    ),
]
COOKING_FOLLOWUPS = [
    (
        "Any tip for a beginner?",
        "Change one thing at a time and write down what you did, so you learn which step made the difference.",
    ),
    (
        "Can I prepare it the day before?",
        "Often, yes. Keep it covered in the fridge and warm it gently or let it "
        "come back to room temperature before serving.",
    ),
]

WRITING_QA = [
    (
        "Can you suggest a subject line for an email asking to reschedule a meeting?",
        'Try: "Request to reschedule our Thursday meeting". It is specific and tells the reader what you need.',
    ),
    (
        "How do I make my writing more concise?",
        'Cut filler words like "very" and "really", prefer active verbs, and keep one idea per sentence. '
        "Read it aloud: wherever you run out of breath, split the sentence.",
    ),
    (
        'What is the difference between "affect" and "effect"?',
        'Usually "affect" is the verb (the rain affected the game) and "effect" is the noun (the rain had an effect).',
    ),
    (
        "How should I start a cover letter?",
        "Open with the role you are applying for and one concrete reason you fit it, instead of a generic greeting line.",
    ),
    (
        "Give me a polite way to decline an invitation.",
        '"Thank you so much for inviting me. Unfortunately I can\'t make it this time, but I hope it goes wonderfully."',
    ),
]

SYNONYMS = {
    "happy": ["cheerful", "content", "glad"],
    "quick": ["fast", "rapid", "swift"],
    "big": ["large", "huge", "sizable"],
    "smart": ["clever", "bright", "sharp"],
    "tired": ["weary", "exhausted", "drained"],
    "calm": ["peaceful", "serene", "tranquil"],
    "difficult": ["hard", "challenging", "tough"],
    "important": ["crucial", "essential", "significant"],
}

# A sentence using the second synonym of each word.
EXAMPLE_SENTENCES = {
    "happy": "He was content with a quiet evening at home.",
    "quick": "The city saw rapid growth after the new railway opened.",
    "big": "A huge wave crashed over the pier.",
    "smart": "She is a bright student who asks good questions.",
    "tired": "After the marathon he was completely exhausted.",
    "calm": "The lake looked serene in the early morning.",
    "difficult": "The final exam was challenging but fair.",
    "important": "Water is essential for every living thing.",
}

CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Canada": "Ottawa",
    "Australia": "Canberra",
    "Brazil": "Brasilia",
    "Kenya": "Nairobi",
    "Norway": "Oslo",
    "Egypt": "Cairo",
    "Argentina": "Buenos Aires",
    "India": "New Delhi",
    "Germany": "Berlin",
    "Mexico": "Mexico City",
    "Portugal": "Lisbon",
    "Vietnam": "Hanoi",
    "Chile": "Santiago",
    "Morocco": "Rabat",
}
CONTINENT = {
    "France": "Europe",
    "Japan": "Asia",
    "Canada": "North America",
    "Australia": "Oceania",
    "Brazil": "South America",
    "Kenya": "Africa",
    "Norway": "Europe",
    "Egypt": "Africa",
    "Argentina": "South America",
    "India": "Asia",
    "Germany": "Europe",
    "Mexico": "North America",
    "Portugal": "Europe",
    "Vietnam": "Asia",
    "Chile": "South America",
    "Morocco": "Africa",
}

# Science answers come with a follow-up that fits each question.
SCIENCE = [
    (
        "Why is the sky blue?",
        "Air molecules scatter short (blue) wavelengths of sunlight much more than long (red) ones, so blue "
        "light reaches your eyes from every direction of the sky.",
        (
            "Then why are sunsets red?",
            "At sunset the light crosses much more air, so most of the blue is scattered "
            "away before it reaches you and the reds and oranges remain.",
        ),
    ),
    (
        "What causes the seasons?",
        "Earth's axis is tilted about 23.4 degrees. As Earth orbits the Sun, each hemisphere takes turns "
        "receiving more direct sunlight and longer days, which is summer there.",
        (
            "So is Earth closer to the Sun in summer?",
            "No. Earth is closest to the Sun in early January, during "
            "northern winter. The tilt matters far more than the distance.",
        ),
    ),
    (
        "How do plants make food?",
        "Through photosynthesis: using light energy, they turn carbon dioxide and water into sugar and release oxygen.",
        (
            "Where does that happen in the plant?",
            "Mostly in the leaves, inside chloroplasts, which contain the green pigment chlorophyll.",
        ),
    ),
    (
        "Why does ice float?",
        "Water expands when it freezes into a crystal lattice, so ice is about 9 percent less dense than liquid water.",
        (
            "Why does that matter for lakes?",
            "Ice forms on top and insulates the water below, so lakes rarely freeze solid and fish survive the winter.",
        ),
    ),
    (
        "What is the difference between weather and climate?",
        "Weather is the state of the atmosphere over hours or days; climate is the average pattern over decades.",
        (
            "Can you give an example?",
            "A cold week in July is weather; the fact that July in that city is usually warm is climate.",
        ),
    ),
    (
        "How does a vaccine work?",
        "It shows the immune system a harmless piece or version of a germ, so the body builds memory cells "
        "and can respond quickly to the real infection later.",
        (
            "Why do some vaccines need boosters?",
            "Immune memory can fade over time, or the germ can change, so a booster refreshes the protection.",
        ),
    ),
]

PRODUCTIVITY_QA = [
    (
        "How can I stop procrastinating?",
        "Make the first step tiny (open the document, write one sentence), set a 25-minute timer, and remove "
        "the distraction you reach for most, like your phone.",
    ),
    (
        "What is a good way to plan my week?",
        "On Sunday, list the three outcomes that matter most, block time for them first, then fit smaller tasks "
        "around those blocks.",
    ),
    (
        "How do I take better notes in meetings?",
        "Write decisions, owners and deadlines, not everything said. End each meeting by reading those back.",
    ),
    (
        "How do I say no to extra work politely?",
        'Name your current priorities and ask which one should move: "I can take this on if we push X to next week."',
    ),
]

FINANCE_QA = [
    (
        "What is compound interest?",
        "Interest earned on both the original amount and the interest already added. Over many years it grows "
        "much faster than simple interest.",
    ),
    (
        "What is an emergency fund?",
        "Savings set aside for unexpected costs such as repairs or job loss, often three to six months of expenses, "
        "kept somewhere easy to access.",
    ),
    (
        "How do I start a simple budget?",
        "Track one month of spending, group it into needs, wants and savings, then set a limit for each group "
        "and check weekly.",
    ),
]


def _ask(rng: random.Random, q: str) -> str:
    opener = rng.choice(OPENERS)
    if opener.endswith((", ", ": ")):  # "Hey, what is ..." reads better than "Hey, What is ..."
        q = q[0].lower() + q[1:]
    return opener + q


def _closing(rng: random.Random, messages: list[dict]) -> None:
    if rng.random() < 0.35:
        messages.append({"role": "user", "content": rng.choice(THANKS)})
        messages.append({"role": "assistant", "content": rng.choice(WELCOME)})


def qa_topic(qa, followups):
    def make(rng: random.Random) -> list[dict]:
        pairs = rng.sample(qa, k=min(len(qa), rng.choice([1, 1, 2])))
        messages = []
        for i, (q, a) in enumerate(pairs):
            messages.append({"role": "user", "content": _ask(rng, q) if i == 0 else q})
            messages.append({"role": "assistant", "content": a})
            if followups and rng.random() < 0.4:
                fq, fa = rng.choice(followups)
                messages.append({"role": "user", "content": fq})
                messages.append({"role": "assistant", "content": fa})
        return messages

    return make


def science(rng: random.Random) -> list[dict]:
    q, a, (fq, fa) = rng.choice(SCIENCE)
    messages = [{"role": "user", "content": _ask(rng, q)}, {"role": "assistant", "content": a}]
    if rng.random() < 0.6:
        messages += [{"role": "user", "content": fq}, {"role": "assistant", "content": fa}]
    _closing(rng, messages)
    return messages


def arithmetic(rng: random.Random) -> list[dict]:
    a, b = rng.randint(12, 99), rng.randint(3, 49)
    op = rng.choice(["times", "plus", "minus"])
    value = {"times": a * b, "plus": a + b, "minus": a - b}[op]
    messages = [{"role": "user", "content": _ask(rng, f"What is {a} {op} {b}?")}]
    if op == "times":
        t, u = divmod(b, 10)
        steps = f"{a} x {b} = {a} x {t * 10} + {a} x {u} = {a * t * 10} + {a * u} = {value}."
        messages.append({"role": "assistant", "content": f"{steps} So the answer is {value}."})
    else:
        messages.append({"role": "assistant", "content": f"{a} {op} {b} is {value}."})
    if rng.random() < 0.6:
        c = rng.randint(2, 9)
        messages.append({"role": "user", "content": f"And if I divide that by {c}?"})
        q, r = divmod(value, c)
        ans = f"{value} divided by {c} is {q}" + (f" with remainder {r} (about {value / c:.2f})." if r else " exactly.")
        messages.append({"role": "assistant", "content": ans})
    return messages


def units(rng: random.Random) -> list[dict]:
    kind = rng.choice(["miles", "celsius", "kg", "inches"])
    if kind == "miles":
        x = rng.randint(2, 300)
        q, a = f"How many kilometers is {x} miles?", f"{x} miles is about {x * 1.609344:.1f} km (1 mile = 1.609344 km)."
    elif kind == "celsius":
        x = rng.randint(-20, 40)
        q, a = (
            f"What is {x} degrees Celsius in Fahrenheit?",
            f"Multiply by 9/5 and add 32: {x} x 9/5 + 32 = {x * 9 / 5 + 32:.1f} degrees Fahrenheit.",
        )
    elif kind == "kg":
        x = rng.randint(1, 120)
        q, a = f"How many pounds are {x} kg?", f"{x} kg is about {x * 2.20462:.1f} pounds (1 kg = 2.20462 lb)."
    else:
        x = rng.randint(1, 80)
        q, a = (
            f"Convert {x} inches to centimeters.",
            f"{x} inches is {x * 2.54:.2f} cm, since one inch is exactly 2.54 cm.",
        )
    messages = [{"role": "user", "content": _ask(rng, q)}, {"role": "assistant", "content": a}]
    _closing(rng, messages)
    return messages


def geography(rng: random.Random) -> list[dict]:
    country = rng.choice(sorted(CAPITALS))
    messages = [
        {"role": "user", "content": _ask(rng, f"What is the capital of {country}?")},
        {"role": "assistant", "content": f"The capital of {country} is {CAPITALS[country]}."},
    ]
    if rng.random() < 0.6:
        messages += [
            {"role": "user", "content": "Which continent is it on?"},
            {"role": "assistant", "content": f"{country} is in {CONTINENT[country]}."},
        ]
    if rng.random() < 0.4:
        other = rng.choice([c for c in sorted(CAPITALS) if c != country])
        messages += [
            {"role": "user", "content": f"And {other}?"},
            {
                "role": "assistant",
                "content": f"The capital of {other} is {CAPITALS[other]}, and {other} is in {CONTINENT[other]}.",
            },
        ]
    return messages


def synonyms(rng: random.Random) -> list[dict]:
    word = rng.choice(sorted(SYNONYMS))
    alts = SYNONYMS[word]
    messages = [
        {"role": "user", "content": _ask(rng, f'Give me a few synonyms for "{word}".')},
        {
            "role": "assistant",
            "content": f'Some synonyms for "{word}": {", ".join(alts)}. '
            f'"{alts[0].capitalize()}" is the most neutral choice.',
        },
    ]
    if rng.random() < 0.5:
        messages += [
            {"role": "user", "content": f'Use "{alts[1]}" in a sentence.'},
            {"role": "assistant", "content": EXAMPLE_SENTENCES[word]},
        ]
    return messages


TOPICS = [
    (qa_topic(PYTHON_QA, PYTHON_FOLLOWUPS), 3),
    (qa_topic(COOKING_QA, COOKING_FOLLOWUPS), 2),
    (qa_topic(WRITING_QA, []), 2),
    (science, 2),
    (qa_topic(PRODUCTIVITY_QA, []), 1),
    (qa_topic(FINANCE_QA, []), 1),
    (arithmetic, 3),
    (units, 2),
    (geography, 2),
    (synonyms, 2),
]


def make_conversation(rng: random.Random) -> dict:
    makers, weights = zip(*TOPICS)
    messages = rng.choices(makers, weights=weights)[0](rng)
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    return {"messages": messages}


def generate(n: int = 300, seed: int = 20261130) -> list[dict]:
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:  # keep conversations distinct so dedupe in prepare keeps them all
        conv = make_conversation(rng)
        key = json.dumps(conv, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(conv)
    return out


def main() -> None:
    path = Path(__file__).with_name("chat.jsonl")
    with open(path, "w") as f:
        for conv in generate():
            f.write(json.dumps(conv, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
