"""Writes train.parquet and val.parquet in verl's format: flip one bit ("flip 1" -> "0").

Run from anywhere: ``python examples/own_data/make_data.py``. Replace this with your own data;
only ``prompt`` is required, ``data_source``, ``reward_model.ground_truth`` and ``extra_info``
are passed to the reward function.
"""

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for index in range(count):
        bit = rng.choice("01")
        out.append(
            {
                "data_source": "flip_bit",
                "prompt": [{"role": "user", "content": f"flip {bit}"}],
                "ability": "logic",
                "reward_model": {"style": "rule", "ground_truth": "1" if bit == "0" else "0"},
                "extra_info": {"index": index},
            }
        )
    return out


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    pq.write_table(pa.Table.from_pylist(rows(2048, seed=0)), here / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows(64, seed=1)), here / "val.parquet")
