"""`eagle-batch regenerate`: the target answers the prompts itself, as a resumable array job.

A draft predicts the target's own next tokens, so it learns most from responses the target wrote. This
package turns a chat dataset (any format prepare reads) into the same conversations with the assistant
turns written by the target, through vLLM and the model's own chat template:

    plan.py      data.inputs -> RUN/regenerate/prepared/ (one JSON Lines file of source conversations per
                 task, plan.json balanced by work, bad_rows.jsonl, summary.json)
    generate.py  the work of one array task: vLLM generates turn by turn for a batch of conversations,
                 and each batch is committed as one output shard
    shards.py    the commit protocol of output shards: a shard is all-or-nothing, a committed conversation
                 is never generated twice, a killed task loses only its uncommitted batch
    summary.py   generated + cut off + failed + skipped == input, every failure with its reason
    cli.py       `eagle-batch regenerate CONFIG [--wait] [--then-prepare]`

The job runs on the launch machinery of extraction (array tasks, checkpoint on the pre-timeout signal,
requeue, `status`, `resume`, `cancel`, the local executor); its run directory is `regenerate.run_dir`
(default RUN/regenerate) and its output, RUN/regenerate/output/, is a folder `prepare` reads as it is.
"""
