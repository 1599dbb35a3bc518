"""eagle-batch: base-model hidden states for EAGLE-3 drafts, extracted with vLLM into Zarr on Slurm.

Data flow, one package each:
    data (prepare) -> capture (vLLM plugin) -> store (Zarr) -> launch (Slurm/submitit) -> train
"""

__version__ = "0.1.0"
