"""Does a draft do in vLLM what it did in training? Teacher-forced accuracy against served acceptance.

    PYTHONPATH=. python lab/train_serve_agreement.py WORKDIR [--prompts 16] [--max-tokens 64] [--steps 120]

The real SmolLM2 answers PROMPTS of the demo chats greedily (vLLM); those answers become the training set
(as `eagle-batch regenerate` makes one); `eagle-batch prepare / extract / train` capture them and fit a draft
to them (`train.accuracy_vs=full`: the accuracy of TTT step 0 is "the draft's top token is the target's
greedy next token"); then vLLM serves the draft on the same prompts. On the target's own greedy text those
are the same event at every position a draft starts from, so the served acceptance of the first draft
position must match the training accuracy of step 0 (up to the positions sampled: a draft starts after
each verification). A large gap means training and serving disagree about the draft's inputs: the layers
or their order, the position a state pairs with, the norm, the vocabulary map, the embeddings.

Prints one JSON line: train_acc_per_step (last logged window), served_accepted_per_position (fraction of
drafts), and the two first-position figures side by side.
"""

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from eagle_batch.cli import main as cli
from eagle_batch.demo_data import CHAT_JSONL
from eagle_batch.models.smollm2 import materialize
from eagle_batch.train.serve_check import measure_acceptance, servable_target


def first_user_turns(n: int) -> list[str]:
    out = []
    for line in CHAT_JSONL.read_text().splitlines():
        msgs = json.loads(line)["messages"]
        user = next((m["content"] for m in msgs if m["role"] == "user"), None)
        if user and user not in out:
            out.append(user)
        if len(out) == n:
            break
    return out


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("work")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--k", type=int, default=3)
    a = p.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    target = servable_target(materialize(), work / "smollm2")
    prompts = first_user_turns(a.prompts)
    alone = measure_acceptance(target, None, prompts, k=0, max_tokens=a.max_tokens, dtype="float32")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    data = work / "answers.jsonl"
    with open(data, "w") as f:
        for prompt, ids in zip(prompts, alone["reference"]["outputs"]):
            answer = tok.decode(ids, skip_special_tokens=True)
            f.write(
                json.dumps(
                    {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}
                )
                + "\n"
            )
    run = work / "run"
    common = [
        f"run_dir={run}",
        f"model.path={target}",
        "model.dtype=float32",
        "model.max_model_len=1024",
        f"data.inputs=[{data}]",
        "data.format=messages",
        "data.max_length=512",
        "extract.enforce_eager=true",
        "slurm.executor=local",
        "slurm.gpus_per_node=0",
        "slurm.cpus_per_task=2",
    ]
    train = [
        f"train.steps={a.steps}",
        "train.batch_tokens=2048",
        "train.lr=3e-3",
        "train.warmup_steps=5",
        "train.draft_vocab_size=4096",
        f"train.ttt_steps={a.k}",
        "train.num_workers=0",
        "train.precision=fp32",
        "train.accuracy_vs=full",
        "train.log_every=10",
        "train.tensorboard=false",
    ]
    cfg = work / "run.yaml"
    OmegaConf.save(OmegaConf.from_dotlist(common + train), cfg)
    for argv_ in (["prepare", str(cfg), "--no-progress"], ["extract", str(cfg), "--wait"], ["aggregate", str(run)]):
        assert cli(argv_) == 0, argv_
    assert cli(["train", str(cfg), "--local", "--no-progress"]) == 0
    metrics = [json.loads(x) for x in (run / "train" / "draft" / "metrics.jsonl").read_text().splitlines()]
    last = [m for m in metrics if "acc_per_step" in m][-1]
    served = measure_acceptance(
        target,
        run / "train" / "draft" / "export",
        prompts,
        k=a.k,
        max_tokens=a.max_tokens,
        reference=alone["reference"],
        dtype="float32",
    )
    drafts = served["num_drafts"] or 1
    per_pos = [x / drafts for x in served["accepted_per_position"]]
    print(
        json.dumps(
            {
                "prompts": len(prompts),
                "train_steps": last["step"],
                "train_acc_per_step": [round(x, 4) for x in last["acc_per_step"]],
                "served_accepted_per_position": [round(x, 4) for x in per_pos],
                "first_position": {"train_acc": round(last["acc_per_step"][0], 4), "served": round(per_pos[0], 4)},
                "mean_acceptance_length": served["mean_acceptance_length"],
                "identical_outputs": served["identical_outputs"],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
