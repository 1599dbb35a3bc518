"""Does a draft do in vLLM what it did in training? Teacher-forced accuracy against served acceptance.

    PYTHONPATH=. python tests/train/train_serve_agreement.py WORKDIR [--prompts 16] [--max-tokens 64] [--steps 120]

Used by test_serve_vllm.py (12 steps) and runnable by hand to record numbers (docs/explanation/training.md).

The real SmolLM2 answers PROMPTS of the demo chats greedily (vLLM); those answers become the training set
(as `eagle-batch regenerate` makes one); `eagle-batch prepare / extract / train` capture them and fit a draft
to them (`train.accuracy_vs=full`: the accuracy of TTT step 0 is "the draft's top token is the target's
greedy next token"); then vLLM serves the draft on the same prompts. On the target's own greedy text those
are the same event at every position a draft starts from, so the served acceptance of the first draft
position must match the training accuracy of step 0 (up to the positions sampled: a draft starts after
each verification). A large gap means training and serving disagree about the draft's inputs: the layers
or their order, the position a state pairs with, the norm, the vocabulary map, the embeddings.

Later positions: a served position s counts drafts whose positions 0..s were all accepted, while the
training accuracy of TTT step s is over all rows (step s is fed the true tokens, right or wrong before). So
the probe also runs the trained draft through the training loss over the samples and takes its chain
statistic, per position the rows whose steps 0..s are all right (teacher_forced_chain_per_position, what
training logs as acc_chain_per_step): that is what served acceptance per position should match.

Prints one JSON line: train_acc_per_step (last logged window), teacher_forced_chain_per_position,
served_accepted_per_position (fraction of drafts), and the two first-position figures side by side.
"""

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from eagle_batch.cli import main as cli
from eagle_batch.demo_data import CHAT_JSONL
from eagle_batch.evaluate.serve_check import measure_acceptance, servable_target
from eagle_batch.models.smollm2 import materialize


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


def teacher_forced_chain(run: Path, k: int) -> list[float]:
    """The trained draft (its last checkpoint) through the training loss (`ttt_loss`) over the run's
    samples: per position s, its chain statistic, the fraction of the rows whose tokens at steps 0..s all count that give
    the target's greedy tokens. That is what a served draft's acceptance per position counts, and what
    training logs as acc_chain_per_step."""
    import torch

    from eagle_batch.config import load_run_config
    from eagle_batch.store import open_dataset
    from eagle_batch.train.data import TrainSamples, collate
    from eagle_batch.train.loss import ttt_loss
    from eagle_batch.train.model import DraftConfig, Eagle3Draft
    from eagle_batch.train.target import TargetHead, target_head

    out = run / "train" / "draft"
    dcfg = DraftConfig.from_json(json.loads((out / "draft_config.json").read_text()))
    th = target_head(load_run_config(run).model.path)
    model = Eagle3Draft(dcfg, th["embed"])
    state = torch.load(sorted((out / "checkpoints").glob("step-*.pt"))[-1], map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    model.eval()
    head = TargetHead(th["norm"], th["lm_head"].float(), dcfg.rms_norm_eps, model.draft_to_target)
    samples = TrainSamples(open_dataset(run), dcfg.aux_layer_ids, dcfg.last_layer_id)
    chain, count = torch.zeros(k), torch.zeros(k)
    with torch.no_grad():
        for i in range(len(samples)):
            _, st = ttt_loss(model, head, collate([samples[i]]), k, 1.0, autocast=False)
            chain += st["chain"]
            count += st["chain_count"]
    return (chain / count.clamp_min(1)).tolist()


def run(work: Path, prompts: int = 16, max_tokens: int = 64, steps: int = 120, k: int = 3) -> dict:
    """The whole comparison in WORK; returns the figures main() prints."""
    work.mkdir(parents=True, exist_ok=True)
    target = servable_target(materialize(), work / "smollm2")
    questions = first_user_turns(prompts)
    alone = measure_acceptance(target, None, questions, k=0, max_tokens=max_tokens, dtype="float32")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    data = work / "answers.jsonl"
    with open(data, "w") as f:
        for prompt, ids in zip(questions, alone["reference"]["outputs"]):
            answer = tok.decode(ids, skip_special_tokens=True)
            f.write(
                json.dumps(
                    {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}
                )
                + "\n"
            )
    run_dir = work / "run"
    common = [
        f"run_dir={run_dir}",
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
        f"train.steps={steps}",
        "train.batch_tokens=2048",
        "train.lr=3e-3",
        "train.warmup_steps=5",
        "train.draft_vocab_size=4096",
        f"train.ttt_steps={k}",
        "train.num_workers=0",
        "train.precision=fp32",
        "train.accuracy_vs=full",
        "train.log_every=10",
        "train.tensorboard=false",
    ]
    cfg = work / "run.yaml"
    OmegaConf.save(OmegaConf.from_dotlist(common + train), cfg)
    for argv_ in (["prepare", str(cfg), "--no-progress"], ["extract", str(cfg), "--wait"], ["aggregate", str(run_dir)]):
        assert cli(argv_) == 0, argv_
    assert cli(["train", str(cfg), "--local", "--no-progress"]) == 0
    metrics = [json.loads(x) for x in (run_dir / "train" / "draft" / "metrics.jsonl").read_text().splitlines()]
    last = [m for m in metrics if "acc_per_step" in m][-1]
    served = measure_acceptance(
        target,
        run_dir / "train" / "draft" / "export",
        questions,
        k=k,
        max_tokens=max_tokens,
        reference=alone["reference"],
        dtype="float32",
    )
    drafts = served["num_drafts"] or 1
    per_pos = [x / drafts for x in served["accepted_per_position"]]
    return {
        "prompts": len(questions),
        "train_steps": last["step"],
        "train_acc_per_step": [round(x, 4) for x in last["acc_per_step"]],
        "served_accepted_per_position": [round(x, 4) for x in per_pos],
        "teacher_forced_chain_per_position": [round(x, 4) for x in teacher_forced_chain(run_dir, k)],
        "first_position": {"train_acc": round(last["acc_per_step"][0], 4), "served": round(per_pos[0], 4)},
        "mean_acceptance_length": served["mean_acceptance_length"],
        "identical_outputs": served["identical_outputs"],
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("work")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--k", type=int, default=3)
    a = p.parse_args(argv)
    print(json.dumps(run(Path(a.work), a.prompts, a.max_tokens, a.steps, a.k)))


if __name__ == "__main__":
    main(sys.argv[1:])
