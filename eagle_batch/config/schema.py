"""The configuration schema: plain dataclasses that omegaconf validates.

One section per stage of the data flow (model -> data -> extract -> store -> slurm -> train). Every
command loads the same `RunConfig` (see `load.py`), so one YAML file describes a whole run. Unknown keys
and wrong types fail at load time with the key's dotted path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class ModelConfig:
    # Local Hugging Face-style folder: config.json, weights, tokenizer files. Never a hub id at run time.
    path: str = MISSING
    # Name recorded in store attributes; defaults to the folder name.
    name: str = ""
    # Recorded with the name (a commit or tag of the weights); "" = not recorded. Never downloaded.
    revision: str = ""
    # Tokenizer folder if it differs from `path`.
    tokenizer: str = ""
    # Chat template override (a Jinja file path); default: the tokenizer's own template.
    chat_template: str = ""
    # The engine's compute dtype: bfloat16 | float16 | float32 (the stored states are bf16 unless store.dtype).
    dtype: str = "bfloat16"
    # GPUs one engine spans (vLLM tensor parallelism); one array task holds that many GPUs.
    tensor_parallel_size: int = 1
    # Hidden-state layer ids to capture; id k = residual stream after k decoder layers, id N = last
    # layer's output before the final norm. None -> EAGLE-3 default [2, N//2, N-3, N].
    layer_ids: list[int] | None = None
    # Run the model folder's own Python code (transformers/vLLM `trust_remote_code`), as you, for: the
    # tokenizer (prepare, regenerate's plan, evaluate: on the login node; e.g. Kimi's tiktoken tokenizer)...
    tokenizer_trust_remote_code: bool = False
    # ... or the model (vLLM or transformers on the GPU nodes; vLLM ships its own classes for the models it
    # supports). Off by default; when on, the command names the folder whose code runs (config/remote_code.py).
    engine_trust_remote_code: bool = False
    # Deprecated: both of the above at once (the one flag of earlier releases); set the one you need instead.
    trust_remote_code: bool = False
    # The engine's context length in tokens; must exceed data.max_length (vLLM needs one position to generate).
    max_model_len: int = 4096


@dataclass
class DataConfig:
    # Input files, folders or globs: .jsonl/.json, .parquet, .arrow, datasets.load_from_disk folders.
    inputs: list[str] = field(default_factory=list)
    # auto | messages | sharegpt | prompt_response | alpaca (instruction, input, output)
    format: str = "auto"
    # The field holding the turns in the messages format ([{role, content}, ...]).
    messages_field: str = "messages"
    # The field holding the turns in the sharegpt format ([{from, value}, ...]).
    conversations_field: str = "conversations"
    # prompt_response format: the fields of the user turn, the assistant answer and an optional system prompt.
    prompt_field: str = "prompt"
    # prompt_response format: the field of the assistant's answer (the tokens with loss).
    response_field: str = "response"
    # prompt_response format: the field of an optional system prompt ("" or absent: none).
    system_field: str = "system"
    # Tokens per sample (prompt and answer together); longer samples are cut at this length.
    max_length: int = 2048
    # Samples with fewer loss tokens (assistant tokens the draft trains on) are dropped and counted; 0 keeps
    # every sample that has any.
    min_loss_tokens: int = 1
    # Drop a sample whose token ids and loss mask equal an earlier one's (counted as duplicate).
    dedupe: bool = True
    # skip: count and report bad rows; error: stop at the first one (file and line named)
    on_bad_row: str = "skip"
    # When the chat template is not prefix-stable (e.g. it drops earlier turns' reasoning):
    # error | per_turn (one sample per assistant turn)
    non_prefix_stable: str = "per_turn"
    # An assistant turn that renders to nothing but end-of-turn markers (a tool call the chat template
    # does not write): mask it out of the loss (the row's other turns are kept) | skip the row | keep
    # (train the draft to end the turn at once).
    empty_assistant_turns: str = "mask"
    # The per-turn field (messages and sharegpt formats) that marks an assistant turn 0/false: left out of
    # the loss, kept in the context; 1/true or absent: trained (Axolotl's `weight`; others name it `train`
    # or `training`). "" trains every assistant turn. Only assistant turns are ever trained on.
    turn_train_field: str = "weight"
    # Keyword arguments for the chat template (e.g. {enable_thinking: false}).
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    limit: int = 0  # read at most this many rows (0 = all); for smoke runs
    # Caps on untrusted input, applied while reading (before anything is parsed whole or tokenized): a record
    # (a JSON Lines line, a JSON array element, a CSV record, a Parquet/Arrow row's strings) longer than this
    # many bytes is a `row_too_long` bad row, skipped unread; memory holds at most one such record. 16 MiB.
    max_row_bytes: int = 16 << 20
    # A .gz input decompressing to more than this many bytes (a decompression bomb) stops being read there:
    # the rest is one `file_too_large` bad row. Bytes; 64 GiB; 0 = no cap.
    max_decompressed_bytes: int = 64 << 30
    # A message (a turn's content, reasoning or tool-call arguments) longer than this many characters makes
    # its row a `message_too_long` bad row, before the chat template or the tokenizer sees it. 1,000,000.
    max_message_chars: int = 1_000_000


@dataclass
class ExtractConfig:
    # Array tasks; the shard plan balances tokens across them.
    num_tasks: int = 1
    # What each array task does (eagle_batch/launch/work.py): capture (hidden states into the task store) |
    # regenerate (set by `eagle-batch regenerate` for its own run) | synthetic (pseudo states, no model: tests
    # a cluster's wiring, launch/synthetic_work.py) | module:function (a work of your own).
    work: str = "capture"
    # extract.work=synthetic: seconds each synthetic sample takes after its commit (a sleep standing for the
    # model's time, so tasks can be signalled or killed mid-way). Default 0.
    synthetic_sample_s: float = 0.0
    # native (vLLM extract_hidden_states + our KV connector) | hooks (worker extension) | hf | auto
    backend: str = "auto"
    # vLLM: sequences one engine step holds at most.
    max_num_seqs: int = 256
    # vLLM: tokens one engine step processes at most (the prefill chunk size).
    max_num_batched_tokens: int = 8192
    # vLLM: the share of each GPU's memory the engine takes (weights, activations, KV cache), in (0, 1].
    gpu_memory_utilization: float = 0.85
    # vLLM: no CUDA graphs or compilation (faster start, slower steps).
    enforce_eager: bool = False
    # vLLM: split long prompts over several steps (max_num_batched_tokens each).
    enable_chunked_prefill: bool = True
    # TP=1 only (TP>1 always runs vLLM's workers in their own processes): where the engine runs.
    # background = vLLM's engine-core process, states reach the store through the shared ring; in-process =
    # this process, no IPC but the engine shares one interpreter lock with the store's threads. auto:
    # background for the native backend on CUDA (faster in every side-by-side H200 measurement: docs/decisions/0017),
    # in-process otherwise (CPU; hooks, whose states would travel through vLLM's RPC). An explicit
    # VLLM_ENABLE_V1_MULTIPROCESSING in the environment wins.
    engine_process: str = "auto"
    # Bytes of the shared-memory ring the states cross when the engine runs in another process; 0 =
    # min(8 GiB, half of the free /dev/shm). When the ring is full the engine waits for the store.
    shm_bytes: int = 0
    # Samples handed to the engine per generate() call; a commit follows each batch.
    batch_samples: int = 512
    # Minimum seconds between commits (a commit is also forced on checkpoint / exit).
    commit_interval_s: float = 30.0
    # Check every captured state for NaN or Inf before it is stored; one fails the task, naming the sample.
    check_finite: bool = True
    # Before submitting, the tokens left to capture are checked against the free space under RUN/stores
    # (launch/disk_room.py): an error when they cannot fit even at the best compression measured, a warning
    # when they fit only compressed; false skips the check. `resume` checks the same and takes it too. It applies
    # to the command it is given to: not saved in RUN/config.yaml, not part of the run's fingerprint.
    check_disk: bool = True
    # validate: the lowest cosine similarity per layer between captured and transformers states that passes.
    validate_min_cosine: float = 0.999
    # validate: the largest relative error per layer (norm of the difference / norm of the reference) that passes.
    validate_max_rel_err: float = 0.05
    # More vLLM engine arguments, passed as they are (e.g. {quantization: fp8}).
    extra_engine_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class StoreConfig:
    # How hidden states are stored: bfloat16 (the model's bits, lossless) | float8_e4m3 (OCP E4M3 codes, 1
    # byte, with a float32 scale per token and layer: 0.61x bf16's bytes, ~2% relative error) | float8_e5m2
    # (E5M2 codes, the same scales: 0.52x bf16's bytes, ~4% relative error); readers return bf16 again
    # (docs/reference/store-format.md "FP8 hidden states", docs/decisions/0020).
    dtype: str = "bfloat16"
    # blosc-zstd | zstd | none
    codec: str = "blosc-zstd"
    # blosc-zstd: c-blosc's clevel, 0..9; zstd: -131072..22 (negative: zstd's fast levels; 0: its default).
    level: int = 1
    # blosc-zstd hidden states only: eagle-batch frames the chunks itself and asks zstd only for entropy
    # coding (fast strategy, small hash table, Huffman-coded literals), which is where bf16 states' gain
    # is: level 1's ratio or better for far less CPU, ordinary blosc frames on disk (store/blosc_frame.py;
    # docs/decisions/0012).
    # `level` then has no effect; false compresses with c-blosc at `level`.
    entropy_only: bool = True
    # Blosc block size in bytes (0: c-blosc chooses); 1 MiB keeps exponent and mantissa bytes apart after byte
    # shuffle.
    blocksize: int = 1 << 20
    # Rows per inner chunk (the unit of compression and of random reads); 0 = about 4 MiB of hidden
    # states: 64 tokens at hidden 7168 x 4 layers, 256 at 2048. Per-chunk work on the capture's threads is
    # fixed-cost Python, so chunks much smaller than that cap the write rate (docs/decisions/0013).
    chunk_tokens: int = 0
    # Rows (tokens) per shard file; a multiple of chunk_tokens.
    shard_tokens: int = 4096
    # fsync every shard and commit before it counts as written (crash-safe); false is faster and may lose
    # the last commit to a power cut.
    fsync: bool = True
    # blosc-zstd only: when every compression thread is busy while the disk keeps up, store the chunk
    # uncompressed (a blosc "memcpyed" frame every blosc reader decodes) instead of making the engine wait.
    # Compression then uses the CPU the node has spare; false compresses every chunk whatever it costs in
    # throughput (docs/decisions/0014).
    adaptive: bool = True
    # Compression threads (0: every CPU of the allocation but two, which the engine keeps).
    encode_threads: int = 0
    # Shard-writing threads for hidden_states (0: as many as shard writes may be queued, so none waits for a
    # thread).
    io_threads: int = 0
    # A folder for the writer's timeline (one JSON line per append, encode, shard write and commit; see
    # eagle_batch/store/trace.py), to see which stage a capture waits for; "" = off.
    trace_dir: str = ""


@dataclass
class RegenerateConfig:
    """`eagle-batch regenerate`: the target writes the assistant turns of the data itself (on-policy data,
    what a draft learns most from). Reads data.inputs like prepare; TP, dtype and max_model_len from model."""

    # The regeneration job's own run directory (plan, task states, logs, output/); default RUN/regenerate.
    run_dir: str = ""
    # Array tasks; conversations are split evenly between them.
    num_tasks: int = 1
    # all: every assistant turn, each generated given the regenerated history before it (assistant turns
    # that carry tool calls are kept as they are: the tool results after them answer those calls) |
    # last: only the final assistant turn (the answer to the last user turn).
    turns: str = "all"
    # Sampling: greedy by default (reproducible, resumes byte for byte); set the temperature you will serve
    # with to train on the distribution the draft will see.
    temperature: float = 0.0
    # Sampling: nucleus cut-off (1.0 = off).
    top_p: float = 1.0
    # Sampling: the k most likely tokens only (-1 = off).
    top_k: int = -1
    # The longest answer generated per assistant turn, in tokens.
    max_tokens: int = 1024
    # Sampling seed (each conversation's own seed is derived from it, so resumes are reproducible).
    seed: int = 0
    # Passed to the chat template when rendering prompts (e.g. {enable_thinking: false}); default: the same
    # as data.chat_template_kwargs, so prepare later renders the conversations the way they were generated.
    chat_template_kwargs: dict[str, Any] | None = None
    # Conversations per engine call; their results are committed together as one output shard.
    batch_conversations: int = 256
    # An answer that hit max_tokens (finish reason "length") lacks its end: counted as cut_off, and kept
    # (the conversation ends with it) only when true.
    keep_cut_off: bool = False
    # vLLM: the share of each GPU's memory the regeneration engine takes, in (0, 1].
    gpu_memory_utilization: float = 0.85


@dataclass
class ContainerConfig:
    # none | apptainer | pyxis
    runtime: str = "none"
    # apptainer: the .sif file; pyxis: the image (squashfs file or registry reference).
    image: str = ""
    # host:container bind mounts; the run, model and data folders are added automatically.
    binds: list[str] = field(default_factory=list)
    # More arguments for `apptainer exec` or srun's pyxis options, passed as they are.
    extra_args: list[str] = field(default_factory=list)


@dataclass
class SlurmConfig:
    # auto (slurm when sbatch is on PATH, else local) | slurm | local
    executor: str = "auto"
    # sbatch --partition ("" = the cluster's default).
    partition: str = ""
    # sbatch --account ("" = your default account).
    account: str = ""
    # sbatch --qos ("" = the default).
    qos: str = ""
    # sbatch --constraint, node features (e.g. "h200").
    constraint: str = ""
    # Nodes per task (a model whose tensor parallelism spans nodes).
    nodes: int = 1
    # GPUs per node each task asks for.
    gpus_per_node: int = 8
    # CPU cores per task (the store's compression threads use them).
    cpus_per_task: int = 32
    mem_gb: int = 0  # 0: do not ask (exclusive nodes get all memory)
    # Time limit per task, in minutes; a task checkpoints and is requeued before it.
    time_min: int = 240
    # sbatch --exclusive: the whole node for each task.
    exclusive: bool = False
    # Most tasks of a submission running at once (Slurm's `%N`); shared by its arrays when it is split.
    array_parallelism: int = 64
    # Most tasks in one Slurm array (count). A submission with more is split into near-equal arrays, which
    # status/resume/cancel treat as one run. 0: the cluster's MaxArraySize (`scontrol show config`, read once
    # per submission); set it when that cannot be read, or lower to submit smaller arrays. Default 0.
    max_array_size: int = 0
    # Local executor: a slot holds its GPUs through a lock file per device, so that another local job on this
    # machine (a resume, another run) waits for them. true: this run's slots neither take nor wait for those
    # locks, and its engines share the GPUs with whatever else runs there, each within its own
    # gpu_memory_utilization share (small models side by side on one GPU).
    share_devices: bool = False
    # Local executor with share_devices: tasks of one submission that run side by side on each GPU group
    # (engines of a small model are bound by the host: several on one GPU generate faster than one), each
    # within its own gpu_memory_utilization share; 1: a group runs its tasks one after another.
    tasks_per_gpu_group: int = 1
    # Seconds before the time limit at which tasks get the checkpoint signal.
    signal_delay_s: int = 120
    # Attempts per task (first run + requeues after failures) before it is reported as given up.
    max_attempts: int = 3
    # Requeues after time limit / preemption (submitit's max_num_timeout).
    max_num_timeout: int = 20
    # More #SBATCH lines, without the prefix (e.g. ["--reservation=big"]).
    additional_sbatch: list[str] = field(default_factory=list)
    # Shell lines run before each task, verbatim (not quoted): your own shell code by design (module load,
    # exports). Anyone who can edit the config can run code as you: it is owner-only in RUN (ownership.py).
    setup: list[str] = field(default_factory=list)
    container: ContainerConfig = field(default_factory=ContainerConfig)


@dataclass
class TrainConfig:
    # Where checkpoints / metrics / export go (default RUN/train/<name>).
    output_dir: str = ""
    # The draft's name: its folder RUN/train/<name> and the name in its exported config.
    name: str = "draft"
    # Optimizer steps to train for. 0 (with epochs 0): no training step; the initial draft is exported, a
    # baseline for trained drafts.
    steps: int = 1000
    epochs: int = 0  # passes over the training data; >0 overrides steps
    # >0: fit the run into this many seconds from its first step (overrides steps / epochs once measured):
    # after a few warm-up steps the speed is measured and the schedule's total set so the cosine ends
    # with the budget; the draft is exported as usual.
    time_budget_s: float = 0.0
    # >0: end the run at this many seconds from its first step, exported like a finished one, even when steps
    # remain (the schedule is cut, not refitted): a hard deadline for a local run.
    max_time_s: float = 0.0
    # `--local`: crashes (a CUDA fault's abort, a segfault, a rank killed) one training survives; each restarts
    # every rank from the last checkpoint, with what is left of max_time_s (launch/local_train.py). 0 with
    # one rank: the trainer runs in the CLI's own process.
    max_restarts: int = 2
    # The peak learning rate (reached after warmup_steps; cosine decay to min_lr_ratio x lr after).
    # lr, optimizer, ttt_*, lm_head_*, norm_*: speculators' EAGLE-3 recipe. On the same states and token budget
    # it trains a better draft than SpecForge's settings (AdamW, 7 TTT steps decayed by 0.8, a random trainable
    # lm_head, no extra norms), and its 3 TTT steps train 1.7x the tokens/s of 7 (decision 0021).
    lr: float = 1e-3
    # muon (Muon on the draft's 2-D weights except lm_head, AdamW on the rest, as speculators trains its
    # drafts) | adamw (AdamW on every trainable parameter); train/optim.py
    optimizer: str = "muon"
    # The learning rate at the end of the cosine schedule, as a share of lr.
    min_lr_ratio: float = 0.1
    # Steps of linear warm-up from 0 to lr.
    warmup_steps: int = 50
    # AdamW weight decay (decoupled).
    weight_decay: float = 0.0
    # Tokens per optimizer step and rank (samples are packed up to it).
    batch_tokens: int = 16384
    # Tokens per sample in training; longer samples are cut.
    max_length: int = 2048
    ttt_steps: int = 3  # unrolled training-time-test steps (SpecForge: 7)
    ttt_decay: float = 1.0  # loss weight decay over TTT steps (SpecForge: 0.8)
    precision: str = "bf16"  # bf16 | fp32
    # Gradient norm clipping (0 = off).
    grad_clip: float = 0.5
    # Seed of the draft's initial weights and the data order.
    seed: int = 0
    # Tokens the draft predicts: the most frequent loss tokens of the training data (capped at the target's
    # vocabulary).
    draft_vocab_size: int = 32000
    # DataLoader worker processes (0 loads batches in the training process).
    num_workers: int = 4
    # Batches each DataLoader worker loads ahead.
    prefetch_factor: int = 4
    # Steps between checkpoints (one is also written at the end and on a stop signal).
    checkpoint_every: int = 200
    # Steps between lines in metrics.jsonl and the progress output.
    log_every: int = 10
    # Also write TensorBoard event files under output_dir (when tensorboard is installed).
    tensorboard: bool = True
    # One Slurm array task per entry: a list of override dicts, e.g. [{train.lr: 1e-4}, {train.lr: 3e-4}]
    sweep: list[dict[str, Any]] = field(default_factory=list)
    # Draft shape overrides (0: the target's): the MLP width,
    draft_intermediate_size: int = 0
    # the attention heads,
    draft_num_heads: int = 0
    # and the key/value heads (must divide the attention heads).
    draft_num_kv_heads: int = 0
    # Target layer ids fed to the draft's fc (default: every stored layer except the last, N).
    aux_layer_ids: list[int] = field(default_factory=list)
    # Export after training to <output_dir>/export (the folder vLLM serves).
    export: bool = True
    # Share of the samples (0-1) held out of training and scored at the end (loss, teacher-forced acceptance
    # length in result.json): picked by a hash of the sample id, so every run over the same data holds out the
    # same samples (a sweep's drafts and a pipelined run compare on them). 0: none.
    holdout_fraction: float = 0.0
    # Pipelined training (`eagle-batch train --follow`): train while extraction still runs, each epoch over the
    # samples committed when it began (train/follow.py). Trains train.steps steps (the CLI converts
    # train.epochs over the prepared data into steps).
    follow: bool = False
    # train.follow: start once this share (0-1) of the tasks' stores are complete (0: at the first commit).
    follow_start_fraction: float = 0.0
    # train.follow: seconds between looks for new commits while waiting for data.
    follow_poll_s: float = 10.0
    # train.follow: give up (an error naming the run) after this many seconds without a new commit while
    # waiting for data; 0 waits without end.
    follow_timeout_s: float = 3600.0
    # Training data: a task store or an aggregated run directory (default: run_dir).
    data: str = ""
    # A sample whose stored data fail their checksum (every chunk read is checked against the crc32c its store
    # committed): fail (default: stop with one message naming the store, array, chunk and samples, and the
    # repair `eagle-batch resume RUN --repair`) | skip (leave each such sample out: a warning line per sample
    # and a total at the end).
    on_damaged: str = "fail"
    # Top-1 accuracy against the target's argmax over its full vocabulary (full) or only over the draft
    # vocabulary (draft: skips V x H target logits per token; an upper bound; for CPU runs).
    accuracy_vs: str = "full"
    # Progress on stderr (rank 0): a bar on a terminal, else one line per logged step; false: neither
    # (`eagle-batch train --no-progress`). metrics.jsonl is written either way.
    progress: bool = True
    # torch.compile the loss's memory-bound passes over [tokens, draft_vocab] (the largest cost of a GPU step
    # after the lm_head matmul); falls back to eager, with a warning, if compiling fails.
    compile: bool = False
    # TTT attention: merged (causal SDPA over the context + the chain's diagonal terms merged exactly; fused
    # kernels, O(T^2)) or masked (one SDPA over all steps' keys with a mask; O(steps x T^2); the reference).
    ttt_attention: str = "merged"
    # The draft's lm_head and final norm at the start: random (std 0.02, as SpecForge) or target (the target's
    # lm_head rows of the draft vocabulary and its final norm, as speculators).
    lm_head_init: str = "target"
    # Keep the draft's lm_head fixed (speculators does, with lm_head_init=target).
    freeze_lm_head: bool = True
    # Draft architecture options vLLM serves from the exported config (speculators turns all three on for
    # EAGLE-3; train/model.py): an RMSNorm over the concatenated aux states before fc; the residual taken
    # after hidden_norm; the normed state fed back to the next draft step.
    norm_before_fc: bool = True
    # See norm_before_fc: the residual taken after hidden_norm.
    norm_before_residual: bool = True
    # See norm_before_fc: the normed state fed back to the next draft step.
    norm_output: bool = True


@dataclass
class RunConfig:
    # Run directory: everything a run writes goes below it.
    run_dir: str = MISSING
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    regenerate: RegenerateConfig = field(default_factory=RegenerateConfig)
