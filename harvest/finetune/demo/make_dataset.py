"""Write the harvest demo SFT dataset (alpaca format) from fixed arithmetic and text rules.

Every example is computed by this script from a seeded RNG, so the data is ours to license (Apache-2.0,
like the repository) and regenerating it gives the same bytes: `python -m harvest.finetune.demo.make_dataset`.
The answers follow one terse format, which a LoRA adapter learns within a few hundred tokens of training.
"""

import argparse
import json
import random
from pathlib import Path

DEMO_DIR = Path(__file__).parent
DATASET_NAME = "harvest_demo"
WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "lamp",
    "garden",
    "window",
    "pencil",
    "forest",
    "bridge",
    "candle",
    "mirror",
    "ocean",
    "tiger",
    "violet",
    "rocket",
    "saddle",
    "harbor",
    "meadow",
    "copper",
]


def _sum(rng: random.Random) -> dict:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return {"instruction": f"Add {a} and {b}.", "input": "", "output": f"{a} + {b} = {a + b}."}


def _reverse(rng: random.Random) -> dict:
    words = rng.sample(WORDS, 3)
    return {
        "instruction": "Reverse the order of these words.",
        "input": " ".join(words),
        "output": " ".join(reversed(words)),
    }


def _sort(rng: random.Random) -> dict:
    numbers = rng.sample(range(1, 50), 4)
    return {
        "instruction": "Sort these numbers from smallest to largest.",
        "input": ", ".join(map(str, numbers)),
        "output": ", ".join(map(str, sorted(numbers))),
    }


def _celsius(rng: random.Random) -> dict:
    celsius = rng.randrange(-20, 45, 5)
    fahrenheit = celsius * 9 // 5 + 32
    return {
        "instruction": f"Convert {celsius} degrees Celsius to Fahrenheit.",
        "input": "",
        "output": f"{celsius} C is {fahrenheit} F.",
    }


RULES = [_sum, _reverse, _sort, _celsius]


def make_examples(num_examples: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [RULES[i % len(RULES)](rng) for i in range(num_examples)]


def write_dataset(out_dir: str | Path = DEMO_DIR, num_examples: int = 512, seed: int = 0) -> Path:
    """Write `<DATASET_NAME>.json` and `dataset_info.json` into `out_dir` (a LlamaFactory `dataset_dir`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{DATASET_NAME}.json").write_text(json.dumps(make_examples(num_examples, seed), indent=1) + "\n")
    info = {DATASET_NAME: {"file_name": f"{DATASET_NAME}.json"}}
    (out_dir / "dataset_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return out_dir


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=str(DEMO_DIR))
    parser.add_argument("--num-examples", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_dataset(args.out_dir, args.num_examples, args.seed))
